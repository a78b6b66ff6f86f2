package test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"cairn/internal/testutil"
)

// exitCode is the exit code of a cairn run (0 when it succeeded).
func exitCode(t *testing.T, err error) int {
	t.Helper()
	var ee *exec.ExitError
	if err == nil {
		return 0
	}
	if !errors.As(err, &ee) {
		t.Fatalf("cairn did not run: %v", err)
	}
	return ee.ExitCode()
}

// TestClusterCLISafety: a job is signalled as asked (TERM reaches the
// ranks' trap, it is not turned into SIGKILL); rm refuses a running job
// or one with checkpoints unless -f, and then says what it deleted; what
// does not exist on the cluster exits 3, a bad name exits 2, and a flag
// that does not apply is a usage error.
func TestClusterCLISafety(t *testing.T) {
	c := testutil.NewCluster(t, 2)
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"restart", "nosuch"}, 3},
		{[]string{"migrate", "nosuch/0"}, 3},
		{[]string{"checkpoint", "nosuch"}, 3},
		{[]string{"restart", "../x"}, 2},
		{[]string{"kill", "-s", "BOGUS", "nosuch"}, 2},
		{[]string{"run", "--job", "j", "--ranks", "2", "--workdir", "/tmp", "--", "true"}, 2},
	} {
		out, err := c.Run(tc.args...)
		if code := exitCode(t, err); code != tc.code {
			t.Errorf("cairn %s: exit %d, want %d\n%s", strings.Join(tc.args, " "), code, tc.code, out)
		}
	}

	c.OK("run", "--job", "sig", "--ranks", "2", "--", "sh", "-c",
		`trap 'echo "got TERM"; exit 7' TERM; echo up; while :; do sleep 0.1; done`)
	for r := range 2 {
		testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
			out := c.Logs("sig", r)
			return strings.Contains(out, "up"), out
		})
	}
	if out, err := c.Run("rm", "sig"); exitCode(t, err) != 1 || !strings.Contains(out, "running") {
		t.Errorf("rm of a running job without -f: %v\n%s", err, out)
	}
	c.OK("kill", "-s", "TERM", "sig")
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		st := c.Status("sig")
		done := true
		for _, r := range st.RankStates {
			done = done && r.Status == "exited" && r.ExitCode != nil && *r.ExitCode == 7
		}
		return done, "ranks did not exit 7 after TERM"
	})
	if out := c.Logs("sig", 1); !strings.Contains(out, "got TERM") {
		t.Errorf("rank 1 never saw TERM:\n%s", out)
	}
	// Ended and without checkpoints: rm needs no -f.
	if out := c.OK("rm", "sig"); !strings.Contains(out, "0 checkpoints") {
		t.Errorf("rm: %s", out)
	}
	if out, err := c.Run("rm", "sig"); exitCode(t, err) != 3 {
		t.Errorf("rm of a removed job: %v\n%s", err, out)
	}
}
