package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cairn-hpc/cairn/internal/container"
)

// notFoundError is a name that is no container here and no job of the
// cluster, saying what exists: it is container.ErrNotFound (exit 3).
type notFoundError struct{ msg string }

func (e notFoundError) Error() string { return e.msg }
func (e notFoundError) Unwrap() error { return container.ErrNotFound }

// notFound turns a container's not-found error (err) of name, which no
// job of the cluster has either, into one that says so, names the nearest
// container or job, and lists what exists. Any other error is returned as
// it is.
func notFound(ctx context.Context, name string, err error) error {
	if !errors.Is(err, container.ErrNotFound) {
		return err
	}
	var containers, jobs []string
	if m, e := manager(); e == nil {
		if list, e := m.List(ctx); e == nil {
			for _, in := range list {
				containers = append(containers, in.Name)
			}
		}
	}
	cluster := false
	if c, e := coordClient(); e == nil {
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		if js, e := c.Jobs(lctx); e == nil {
			cluster = true
			for _, j := range js {
				jobs = append(jobs, j.Name)
			}
		}
		cancel()
		c.Close()
	}
	msg := "no container or job " + name
	if !cluster {
		msg = "no container " + name
	}
	if near := nearest(name, append(append([]string(nil), containers...), jobs...)); near != "" {
		msg += "; did you mean " + near + "?"
	}
	msg += "; containers here: " + listOf(containers)
	if cluster {
		msg += "; jobs: " + listOf(jobs)
	}
	return notFoundError{msg}
}

// listOf lists names, at most 10 of them.
func listOf(names []string) string {
	switch {
	case len(names) == 0:
		return "none"
	case len(names) > 10:
		return strings.Join(names[:10], ", ") + fmt.Sprintf(" and %d more", len(names)-10)
	}
	return strings.Join(names, ", ")
}

// nearest is the one of names closest to name by edit distance, if it is
// close enough to be a typing slip (at most 2 edits, and fewer than half
// of name's letters).
func nearest(name string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if d := editDistance(name, n); d < bestD && 2*d < len(name) {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Damerau-Levenshtein distance of a and b (with
// adjacent transpositions), by bytes.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
