// Package tracetest runs scripted traces, for tests of state machines
// (coord/round, coord/machine): each testdata file is a list of commands,
// one a line, each followed by the lines it printed, prefixed "> ". A run
// replays the commands and compares what they print now with the file;
// -rewrite writes the new output into the file instead, to be reviewed as
// a diff (etcd-io/raft's interaction tests, smaller). Blank lines and lines
// starting with "#" are kept as they are.
package tracetest

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the trace files with the actual output")

// Run runs every file that pattern matches (testdata/*.txt) as a subtest
// of its name: it calls start once a file, then the function start returns
// for each command line; that function returns what the command printed,
// or an error for a mistake in the script itself, which fails the test.
func Run(t *testing.T, pattern string, start func(t *testing.T) func(line string) ([]string, error)) {
	files, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no traces match %s", pattern)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			want := string(data)
			got := replay(t, want, start(t))
			if *rewrite {
				if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s mismatch (-want +got), run with -rewrite to accept:\n%s", file, diff)
			}
		})
	}
}

func replay(t *testing.T, script string, run func(string) ([]string, error)) string {
	t.Helper()
	var b strings.Builder
	for i, line := range strings.Split(strings.TrimRight(script, "\n"), "\n") {
		if strings.HasPrefix(line, ">") {
			continue
		}
		b.WriteString(line + "\n")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out, err := run(line)
		if err != nil {
			t.Fatalf("line %d: %q: %v", i+1, line, err)
		}
		for _, o := range out {
			b.WriteString("> " + o + "\n")
		}
	}
	return b.String()
}
