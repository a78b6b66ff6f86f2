package coord

import (
	"errors"
	"slices"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
)

func nodes(names ...string) []coordv1.Node {
	var out []coordv1.Node
	for _, n := range names {
		out = append(out, coordv1.Node{Name: n, Alive: true})
	}
	return out
}

func codeOf(err error) string {
	var e *coordv1.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// TestPlace: ranks go to the least loaded candidates, at most perNode on
// each (evenly when 0), a spare wins a tie, a preferred node is kept when
// it is a candidate with room, and what cannot fit is refused.
func TestPlace(t *testing.T) {
	loaded := nodes("a", "b", "c")
	loaded[0].Ranks = 2
	spare := nodes("a", "b")
	spare[1].Spare = true
	for _, tc := range []struct {
		name    string
		n, per  int
		cands   []coordv1.Node
		prefer  []string
		want    []string
		errCode string
	}{
		{"evenly", 4, 0, nodes("a", "b"), nil, []string{"a", "b", "a", "b"}, ""},
		{"per node", 3, 3, nodes("a", "b"), nil, []string{"a", "b", "a"}, ""},
		{"least loaded first", 2, 0, loaded, nil, []string{"b", "c"}, ""},
		{"a spare wins a tie", 1, 0, spare, nil, []string{"b"}, ""},
		{"preferred kept", 2, 1, nodes("a", "b", "c"), []string{"c", "nosuch"}, []string{"c", "a"}, ""},
		{"preferred full", 2, 1, nodes("a", "b"), []string{"a", "a"}, []string{"a", "b"}, ""},
		{"does not fit", 5, 2, nodes("a", "b"), nil, nil, coordv1.CodeNoNodes},
		{"no node", 1, 0, nil, nil, nil, coordv1.CodeNoNodes},
	} {
		got, err := place(tc.n, tc.per, tc.cands, tc.prefer)
		if tc.errCode != "" {
			if codeOf(err) != tc.errCode {
				t.Errorf("%s: %v, %v; want error %s", tc.name, got, err, tc.errCode)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

// TestReplicaTargets: new copies go around the ring of node names after
// the first holder, never to a holder, other racks first.
func TestReplicaTargets(t *testing.T) {
	racked := nodes("a", "b", "c", "d")
	for i, r := range []string{"r1", "r1", "r2", "r2"} {
		racked[i].Labels = map[string]string{"rack": r}
	}
	for _, tc := range []struct {
		name string
		have []string
		want int
		live []coordv1.Node
		out  []string
	}{
		{"after the holder", []string{"b"}, 2, nodes("d", "a", "c", "b"), []string{"c", "d"}},
		{"around the ring", []string{"d"}, 2, nodes("a", "b", "c", "d"), []string{"a", "b"}},
		{"never a holder", []string{"a", "b"}, 5, nodes("a", "b", "c"), []string{"c"}},
		{"other rack first", []string{"a"}, 2, racked, []string{"c", "b"}},
		{"none wanted", []string{"a"}, 0, nodes("a", "b"), nil},
		{"no holder", nil, 1, nodes("a", "b"), nil},
	} {
		if got := replicaTargets(tc.have, tc.want, tc.live); !slices.Equal(got, tc.out) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.out)
		}
	}
}

// TestRestorable: the newest durable or protected checkpoint whose every
// rank image has a live copy; a named one must be that, or it is refused
// with the reason.
func TestRestorable(t *testing.T) {
	live := map[string]coordv1.Node{"a": {Name: "a"}, "b": {Name: "b"}}
	ck := func(seq int, state coordv1.CkptState, copies ...[]string) coordv1.Ckpt {
		c := coordv1.Ckpt{Job: "j", Seq: seq, State: state}
		for r, cs := range copies {
			c.Ranks = append(c.Ranks, coordv1.CkptRank{Rank: r, Node: cs[0], Copies: cs})
		}
		return c
	}
	cks := []coordv1.Ckpt{
		ck(1, coordv1.CkptProtected, []string{"a", "b"}, []string{"b", "a"}),
		ck(2, coordv1.CkptDurable, []string{"a"}, []string{"b"}),
		ck(3, coordv1.CkptDurable, []string{"a"}, []string{"dead"}),      // rank 1 lost
		ck(4, coordv1.CkptAborted, []string{"a"}, []string{"b"}),         // never durable
		ck(5, coordv1.CkptDurable, []string{"dead", "b"}, []string{"a"}), // a replica lives
	}
	for _, tc := range []struct {
		name    string
		from    int
		cks     []coordv1.Ckpt
		want    int
		errCode string
	}{
		{"newest restorable", 0, cks, 5, ""},
		{"skips lost and aborted", 0, cks[:4], 2, ""},
		{"named", 1, cks, 1, ""},
		{"named, lost", 3, cks, 0, coordv1.CodeNoCkpt},
		{"named, aborted", 4, cks, 0, coordv1.CodeNoCkpt},
		{"named, unknown", 9, cks, 0, coordv1.CodeNoCkpt},
		{"none", 0, cks[2:4], 0, coordv1.CodeNoCkpt},
	} {
		got, err := restorable(tc.cks, tc.from, live, "")
		if tc.errCode != "" {
			if codeOf(err) != tc.errCode {
				t.Errorf("%s: %v, %v; want error %s", tc.name, got, err, tc.errCode)
			}
			continue
		}
		if err != nil || got.Seq != tc.want {
			t.Errorf("%s: %v, %v; want checkpoint %d", tc.name, got, err, tc.want)
		}
	}
}

// TestHeardWithin: a restart leaves out the nodes that missed heartbeats
// (silent for more than half a lease), keeps those heard from lately and
// those this coordinator has not heard from at all (it just took over),
// and does not change what it was given.
func TestHeardWithin(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	cands := nodes("a", "b", "c", "d")
	heard := map[string]time.Time{
		"a": now.Add(-time.Second),
		"b": now.Add(-6 * time.Second), // missed two heartbeats of a 10s lease
		"c": now.Add(-5 * time.Second), // just so
	}
	var got []string
	for _, n := range heardWithin(cands, heard, now, 5*time.Second) {
		got = append(got, n.Name)
	}
	if want := []string{"a", "c", "d"}; !slices.Equal(got, want) {
		t.Errorf("heard within 5s: %v, want %v", got, want)
	}
	if len(cands) != 4 || cands[1].Name != "b" {
		t.Errorf("the candidates given were changed: %v", cands)
	}
}
