// Package names checks the names and numbers that reach cairn from outside
// (the command line, the agent and coordinator APIs, export files, peers)
// before any of them is used to build a path. Every check returns an error
// wrapping [ErrInvalid].
package names

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// ErrInvalid is wrapped by every error of this package.
var ErrInvalid = errors.New("invalid name")

// invalid is an error whose text says what was wrong and which wraps
// [ErrInvalid].
type invalid string

func (e invalid) Error() string        { return string(e) }
func (e invalid) Is(target error) bool { return target == ErrInvalid }

func errorf(format string, args ...any) error { return invalid(fmt.Sprintf(format, args...)) }

var (
	containerRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)
	jobRE       = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,39}$`)
)

// Container checks a container name: 1-63 letters, digits, '_', '.' and
// '-', starting with a letter or digit. Such a name is one path element and
// never "." or "..".
func Container(name string) error {
	if !containerRE.MatchString(name) {
		return errorf("invalid container name %q: use 1-63 letters, digits, '_', '.', '-', starting with a letter or digit", name)
	}
	return nil
}

// Job checks a job name: 1-40 lowercase letters, digits, '_' and '-',
// starting with a letter or digit, so that JOB.RANK is a container name.
func Job(name string) error {
	if !jobRE.MatchString(name) {
		return errorf("invalid job name %q: use 1-40 lowercase letters, digits, '_' and '-', starting with a letter or digit", name)
	}
	return nil
}

// Node checks a node name: one lowercase DNS label.
func Node(name string) error {
	if name == "" || len(name) > 63 {
		return errorf("invalid node name %q: 1-63 bytes", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' && i > 0 && i < len(name)-1
		if !ok {
			return errorf("invalid node name %q: only a-z, 0-9 and inner '-'", name)
		}
	}
	return nil
}

// Seq checks a checkpoint number: 1 or more.
func Seq(seq int) error {
	if seq < 1 {
		return errorf("invalid checkpoint number %d: must be 1 or more", seq)
	}
	return nil
}

// Rank checks a rank number against a job's size (size <= 0: unknown).
func Rank(rank, size int) error {
	if rank < 0 || size > 0 && rank >= size {
		return errorf("invalid rank %d of %d", rank, size)
	}
	return nil
}

// ParseRef splits "NAME:SEQ" (or "NAME" with seq 0) and checks both parts.
func ParseRef(ref string) (name string, seq int, err error) {
	name, s, found := strings.Cut(ref, ":")
	if err := Container(name); err != nil {
		return "", 0, err
	}
	if !found {
		return name, 0, nil
	}
	seq, err = strconv.Atoi(s)
	if err != nil {
		return "", 0, errorf("invalid checkpoint number %q in %q", s, ref)
	}
	if err := Seq(seq); err != nil {
		return "", 0, err
	}
	return name, seq, nil
}

// ParseRank splits "JOB/RANK" into a job and a rank number (0 or more).
func ParseRank(s string) (job string, rank int, err error) {
	job, r, ok := strings.Cut(s, "/")
	rank, err = strconv.Atoi(r)
	if !ok || job == "" || err != nil || rank < 0 {
		return "", 0, errorf("%q: want JOB/RANK, e.g. sim/3", s)
	}
	return job, rank, nil
}
