package agent

import (
	"errors"
	"testing"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
)

// TestFence: a newer term is let through and remembered, across a
// restart of the agent (a new fence on the same dir); an older one of the
// same catalog is refused, the same one goes on; a term of a catalog made
// anew counts again.
func TestFence(t *testing.T) {
	term := func(n uint64) agentv1.Term { return agentv1.Term{N: n, Catalog: "c0ffee"} }
	dir := t.TempDir()
	f := newFence(dir)
	for _, n := range []uint64{1, 1, 3} {
		if err := f.admit(term(n)); err != nil {
			t.Fatalf("term %d: %v", n, err)
		}
	}
	if err := f.admit(term(2)); !errors.Is(err, errStaleTerm) {
		t.Fatalf("term 2 after 3: %v, want refused", err)
	}
	again := newFence(dir)
	if err := again.admit(term(2)); !errors.Is(err, errStaleTerm) {
		t.Fatalf("term 2 after a restart that saw 3: %v, want refused", err)
	}
	if err := again.admit(term(3)); err != nil {
		t.Fatalf("term 3 after a restart: %v", err)
	}
	fresh := agentv1.Term{N: 1, Catalog: "5eed"}
	if err := again.admit(fresh); err != nil {
		t.Fatalf("term 1 of a new catalog: %v", err)
	}
	if err := again.admit(agentv1.Term{N: 1, Catalog: "5eed"}); err != nil {
		t.Fatalf("the new catalog's term again: %v", err)
	}
	if err := again.admit(agentv1.Term{}); !errors.Is(err, errStaleTerm) {
		t.Fatalf("no term after term 1 of 5eed: %v, want refused", err)
	}
	if err := newFence("").admit(agentv1.Term{}); err != nil {
		t.Fatalf("no term on an agent no coordinator has called: %v", err)
	}
	if err := again.raise(term(7)); err != nil {
		t.Fatal(err)
	}
	if err := again.admit(fresh); err != nil {
		t.Fatalf("term 1 of 5eed after term 7 of c0ffee was raised (another catalog): %v", err)
	}
	if err := again.raise(agentv1.Term{N: 5, Catalog: "5eed"}); err != nil {
		t.Fatal(err)
	}
	if err := again.admit(agentv1.Term{N: 4, Catalog: "5eed"}); !errors.Is(err, errStaleTerm) {
		t.Fatalf("term 4 after term 5 was told in a heartbeat reply: %v, want refused", err)
	}
	if got, err := agentv1.ParseTerm(fresh.String()); err != nil || got != fresh {
		t.Errorf("ParseTerm(%q) = %v, %v", fresh.String(), got, err)
	}
	for _, bad := range []string{"", "3", "x/c0ffee", "3/"} {
		if _, err := agentv1.ParseTerm(bad); err == nil {
			t.Errorf("ParseTerm(%q) took it", bad)
		}
	}
}
