package names

import (
	"errors"
	"strings"
	"testing"
)

func TestContainer(t *testing.T) {
	for _, ok := range []string{"a", "ring.0", "A_b-c.d", strings.Repeat("x", 63)} {
		if err := Container(ok); err != nil {
			t.Errorf("Container(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "../x", "/abs", "a/b", ".hidden", "-x", "a\x00", "a b", strings.Repeat("x", 64), "a\n"} {
		err := Container(bad)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("Container(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestJobNodeSeq(t *testing.T) {
	if Job("ring") != nil || Job("Ring") == nil || Job("a.b") == nil || Job("../x") == nil {
		t.Error("Job")
	}
	if Node("n1") != nil || Node("N1") == nil || Node("-a") == nil || Node("a/b") == nil || Node("") == nil {
		t.Error("Node")
	}
	if Seq(1) != nil || Seq(0) == nil || Seq(-3) == nil {
		t.Error("Seq")
	}
	if Rank(0, 2) != nil || Rank(2, 2) == nil || Rank(-1, 0) == nil {
		t.Error("Rank")
	}
}

func TestParseRef(t *testing.T) {
	n, s, err := ParseRef("c1:3")
	if err != nil || n != "c1" || s != 3 {
		t.Fatalf("ParseRef = %q %d %v", n, s, err)
	}
	n, s, err = ParseRef("c1")
	if err != nil || n != "c1" || s != 0 {
		t.Fatalf("ParseRef = %q %d %v", n, s, err)
	}
	for _, bad := range []string{"../x:1", "c:0", "c:x", "c:-1", ":1"} {
		if _, _, err := ParseRef(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseRef(%q) = %v", bad, err)
		}
	}
}

func TestParseRank(t *testing.T) {
	if job, rank, err := ParseRank("sim/3"); job != "sim" || rank != 3 || err != nil {
		t.Errorf("ParseRank(sim/3) = %q, %d, %v", job, rank, err)
	}
	for _, bad := range []string{"sim", "/3", "sim/", "sim/-1", "sim/x"} {
		if _, _, err := ParseRank(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseRank(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}
