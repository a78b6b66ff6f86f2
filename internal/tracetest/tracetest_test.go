package tracetest

import (
	"fmt"
	"strings"
	"testing"
)

// A replay drops the old output, keeps comments and blank lines, and
// writes what each command prints now under it.
func TestReplay(t *testing.T) {
	script := "# a comment\nadd 1\n> stale\n\nadd 2\n"
	sum := 0
	got := replay(t, script, func(line string) ([]string, error) {
		var n int
		if _, err := fmt.Sscanf(line, "add %d", &n); err != nil {
			return nil, err
		}
		sum += n
		return []string{fmt.Sprint("sum ", sum)}, nil
	})
	want := "# a comment\nadd 1\n> sum 1\n\nadd 2\n> sum 3\n"
	if got != want {
		t.Errorf("replay:\n%s\nwant:\n%s", got, want)
	}
	if strings.Contains(got, "stale") {
		t.Error("old output survived the replay")
	}
}
