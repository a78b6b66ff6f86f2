package main

import "testing"

func TestNearest(t *testing.T) {
	names := []string{"ring", "sim", "solver-7"}
	for name, want := range map[string]string{"rign": "ring", "rin": "ring", "sin": "sim", "solver-8": "solver-7", "xyz": "", "ab": "", "ringer": "ring"} {
		if got := nearest(name, names); got != want {
			t.Errorf("nearest(%q) = %q, want %q", name, got, want)
		}
	}
}
