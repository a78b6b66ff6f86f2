package store_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/store"
)

// Environment of a child process started by the SIGKILL tests: TestMain
// runs the role named by childRoleEnv instead of the tests.
const (
	childRoleEnv = "CAIRN_STORE_TEST_CHILD"
	childDirEnv  = "CAIRN_STORE_TEST_DIR"
	childSeedEnv = "CAIRN_STORE_TEST_SEED"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childRoleEnv); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

// runChild writes to the store in $CAIRN_STORE_TEST_DIR until it is killed,
// reporting on stdout, one line each:
//
//	put <id>          after PutManifest(<id>) returned
//	gc <id> <id> ...  before a GC keeping those manifests starts
func runChild(role string) int {
	seed, _ := strconv.ParseUint(os.Getenv(childSeedEnv), 10, 64)
	opts := store.Options{Compression: store.CompressionFastest, PackSize: 32 << 10}
	s, err := store.Open(os.Getenv(childDirEnv), opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 99))
	var pool [][]byte
	var written []store.ID
	for i := 0; i < 1000; i++ {
		id, err := putFiles(ctx, s, genFiles(rng, &pool))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		fmt.Printf("put %s\n", id)
		written = append(written, id)
		if rng.IntN(4) == 0 {
			if err := s.Flush(ctx); err != nil { // an extra index file
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
		}
		if role == "gc" && i%3 == 2 {
			keep := written[max(0, len(written)-3):]
			var line strings.Builder
			line.WriteString("gc")
			for _, k := range keep {
				line.WriteString(" " + k.String())
			}
			fmt.Println(line.String())
			if _, err := s.GC(ctx, keep, store.GCOptions{}); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
			written = slices.Clone(keep)
			if len(pool) > 64 {
				pool = pool[len(pool)-64:]
			}
		}
	}
	return 0
}

// killIterations is the number of SIGKILL rounds per test: a few by
// default, many with CAIRN_SOAK=1.
func killIterations() int {
	if os.Getenv("CAIRN_SOAK") == "1" {
		return 200
	}
	return 10
}

// TestKillIngest kills a writer ingesting manifests at a random moment and
// checks that the store it leaves opens, checks clean, and holds every
// manifest the writer reported written.
func TestKillIngest(t *testing.T) {
	for seed := range uint64(killIterations()) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { killAndCheck(t, "ingest", seed) })
	}
}

// TestKillGC does the same to a writer that ingests and garbage collects,
// checking every manifest that no GC was asked to remove.
func TestKillGC(t *testing.T) {
	for seed := range uint64(killIterations()) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { killAndCheck(t, "gc", seed) })
	}
}

func killAndCheck(t *testing.T, role string, seed uint64) {
	dir := t.TempDir()
	lines := runAndKill(t, role, dir, seed)

	// The model: manifests put, minus those a GC was asked to drop.
	required := make(map[store.ID]bool)
	for _, l := range lines {
		f := strings.Fields(l)
		switch {
		case len(f) == 2 && f[0] == "put":
			id, err := store.ParseID(f[1])
			if err != nil {
				t.Fatalf("child said %q", l)
			}
			required[id] = true
		case len(f) >= 1 && f[0] == "gc":
			keep := make(map[store.ID]bool)
			for _, h := range f[1:] {
				id, err := store.ParseID(h)
				if err != nil {
					t.Fatalf("child said %q", l)
				}
				keep[id] = true
			}
			for id := range required {
				if !keep[id] {
					delete(required, id)
				}
			}
		}
	}

	s := reopen(t, dir)
	ctx := context.Background()
	r, err := s.Check(ctx, store.CheckOptions{ReadData: true})
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if !r.OK() || len(r.UnindexedPacks) != 0 {
		t.Fatalf("Check after SIGKILL: %+v", r)
	}
	listed, err := s.Manifests(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for id := range required {
		if !slices.Contains(listed, id) {
			t.Errorf("manifest %s reported written is missing", id.Short())
		}
	}
	// Every listed manifest, reported or not, is complete.
	for _, id := range listed {
		if _, err := readFiles(ctx, s, id); err != nil {
			t.Errorf("manifest %s: %v", id.Short(), err)
		}
	}
	t.Logf("%d lines from the child, %d manifests required, %d listed, %d chunks", len(lines), len(required), len(listed), s.Stats().Chunks)
}

// runAndKill runs the child role on dir, kills it with SIGKILL after a
// delay drawn from seed, and returns the lines it printed.
func runAndKill(t *testing.T, role, dir string, seed uint64) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childRoleEnv+"="+role, childDirEnv+"="+dir, childSeedEnv+"="+fmt.Sprint(seed))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	linesc := make(chan []string)
	go func() {
		var lines []string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		_, _ = io.Copy(io.Discard, stdout)
		linesc <- lines
	}()
	// Kill at a random moment: the child takes tens of milliseconds to
	// start, then writes a manifest every few milliseconds.
	rng := rand.New(rand.NewPCG(seed, 1))
	time.Sleep(time.Duration(50+rng.IntN(400)) * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Logf("kill: %v", err)
	}
	lines := <-linesc
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
		t.Fatalf("child was not killed: %v; stderr:\n%s", err, stderr.String())
	}
	return lines
}
