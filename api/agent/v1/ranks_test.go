package v1

import "testing"

// TestParseRankName: a rank's identity is read from its container's name
// (the agent trusts it for the rank API); other names are no rank's.
func TestParseRankName(t *testing.T) {
	for name, want := range map[string]struct {
		job  string
		rank int
		ok   bool
	}{"ring.3": {"ring", 3, true}, "a.b.12": {"a.b", 12, true}, "ring": {"", 0, false}, ".1": {"", 0, false}, "ring.x": {"ring", 0, false}, "ring.-1": {"ring", -1, false}, "ring.+1": {"", 0, false}, "ring.01": {"", 0, false}} {
		job, rank, ok := ParseRankName(name)
		if ok != want.ok || ok && (job != want.job || rank != want.rank) {
			t.Errorf("ParseRankName(%q) = %q %d %v, want %+v", name, job, rank, ok, want)
		}
		if ok && RankName(job, rank) != name {
			t.Errorf("RankName(ParseRankName(%q)) = %q", name, RankName(job, rank))
		}
	}
}
