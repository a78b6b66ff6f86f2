package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/rankclient/ranktest"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestRankCLI: cairn rank against the fake rank endpoint: what it prints,
// with and without --json, and its exit codes.
func TestRankCLI(t *testing.T) {
	bin := testutil.CairnBinary(t)
	dir, err := os.MkdirTemp("", "rank")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := ranktest.New(t, ranktest.Config{Dir: dir, Job: "sim", Rank: 2, Size: 4, Ckpt: 3})
	s.Next(ranktest.Done, ranktest.Restored, ranktest.Aborted)
	rank := func(socket string, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"rank"}, args...)...)
		cmd.Env = append(os.Environ(), "CAIRN_SOCKET="+socket)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("cairn rank %v: %v", args, err)
		}
		return out.String(), errb.String(), code
	}
	tests := []struct {
		args      []string
		code      int
		out, errs string
	}{
		{[]string{"info"}, 0, "job=sim rank=2 size=4 mode=transparent ckpt=3 restored=false restored_from=0 incarnation=1\n", ""},
		{[]string{"checkpoint"}, 0, "checkpoint 4 done\n", ""},
		{[]string{"checkpoint", "--json"}, 0, "{\n  \"state\": \"restored\",\n  \"restored_from\": 5\n}\n", ""},
		{[]string{"--job", "sim", "checkpoint"}, 1, "", "aborted: checkpoint sim:6 aborted"},
		{[]string{"stop", "--job=other"}, 1, "", "forbidden: job other"},
		{[]string{"event", "phase", "--", "--half way"}, 0, "published phase\n", ""},
		{[]string{"event", "a b", "x"}, 2, "", "bad_request: event kind"},
		{[]string{"event", "phase"}, 2, "", "want info, checkpoint, stop or event KIND MESSAGE"},
		{[]string{"reboot"}, 2, "", "cairn rank reboot"},
		{[]string{"info", "--verbose"}, 2, "", "unknown flag --verbose"},
		{[]string{"info", "--job"}, 2, "", "unknown flag --job, or a flag without its value"},
	}
	for _, tc := range tests {
		out, errs, code := rank(s.Path(), tc.args...)
		if code != tc.code || out != tc.out || !strings.Contains(errs, tc.errs) {
			t.Errorf("cairn rank %s: exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr with %q",
				strings.Join(tc.args, " "), code, out, errs, tc.code, tc.out, tc.errs)
		}
	}
	type info struct {
		Job         string
		Rank        int
		Restored    bool
		Incarnation int
	}
	out, _, code := rank(s.Path(), "info", "--json")
	var got info
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || got != (info{"sim", 2, true, 2}) {
		t.Errorf("info --json: exit %d, %v: %s", code, err, out)
	}
	if out, _, code := rank(s.Path(), "--help"); code != 0 || !strings.Contains(out, "Exit codes:") {
		t.Errorf("rank --help: exit %d\n%s", code, out)
	}
	if _, errs, code := rank(filepath.Join(dir, "none", "rank.sock"), "info"); code != 1 || !strings.Contains(errs, "no rank endpoint") {
		t.Errorf("rank info without an endpoint: exit %d, %q", code, errs)
	}
	if evs := s.Events(); len(evs) != 1 || evs[0] != (ranktest.Event{Kind: "phase", Message: "--half way"}) {
		t.Errorf("events %+v", evs)
	}
	if tr := strings.Join(s.Trace(), ","); strings.Contains(tr, "checkpoint stop") || strings.Count(tr, "checkpoint") != 3 {
		t.Errorf("trace %s: the forbidden stop reached the endpoint, or a checkpoint did not", tr)
	}
}
