package coord

import (
	"slices"
	"testing"
)

// TestUserEnvKeepsIdentity: -e and --export cannot set the variables
// that say who a rank is: cairn's own come first and theirs are dropped.
func TestUserEnvKeepsIdentity(t *testing.T) {
	own := []string{"CAIRN_JOB=ring", "CAIRN_SIZE=4", "CAIRN_MODE=transparent", "CAIRN_RANK=1"}
	got := userEnv([]string{"CAIRN_JOB=other", "CAIRN_RANK=0", "CAIRN_MODE=app", "OMP_NUM_THREADS=2", "CAIRN_COORDINATOR=x:1"}, own)
	if want := []string{"OMP_NUM_THREADS=2", "CAIRN_COORDINATOR=x:1"}; !slices.Equal(got, want) {
		t.Fatalf("userEnv = %v, want %v", got, want)
	}
}
