// The agent's side of coordinator terms (api/agent/v1 TermHeader): it
// remembers the newest term that called it, in its data dir so that a
// restart does not forget it, and refuses calls from older ones.

package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
)

// termFile holds, in the data dir, the newest coordinator term seen.
const termFile = "coordinator-term"

// fence admits coordinators' calls by their term.
type fence struct {
	mu     sync.Mutex
	path   string // "": kept in memory only
	newest agentv1.Term
}

// newFence reads the newest term seen from dir ("" for none).
func newFence(dir string) *fence {
	f := &fence{}
	if dir == "" {
		return f
	}
	f.path = filepath.Join(dir, termFile)
	if b, err := os.ReadFile(f.path); err == nil {
		f.newest, _ = agentv1.ParseTerm(strings.TrimSpace(string(b)))
	}
	return f
}

// errStaleTerm is admit's error for a call of an older term.
var errStaleTerm = errors.New("stale coordinator term")

// admit lets a call of term through unless a newer term of the same
// catalog has called; any other term becomes the newest, and is written
// down before the call is let through. A call without a term is let
// through only while no term has been seen (an agent of no cluster),
// and never becomes the newest.
func (f *fence) admit(term agentv1.Term) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case term.N == 0 && f.newest.N != 0:
		return fmt.Errorf("%w: a coordinator without a term calls, but one of term %s has called this node", errStaleTerm, f.newest)
	case term.N == 0:
		return nil
	case term.Older(f.newest):
		return fmt.Errorf("%w: a coordinator of term %s calls, but one of term %s has called this node since: a newer coordinator leads", errStaleTerm, term, f.newest)
	case term == f.newest:
		return nil
	}
	if f.path != "" {
		tmp := f.path + ".tmp"
		if err := os.WriteFile(tmp, []byte(term.String()+"\n"), 0o600); err != nil {
			return fmt.Errorf("record coordinator term %s: %w", term, err)
		}
		if err := os.Rename(tmp, f.path); err != nil {
			return fmt.Errorf("record coordinator term %s: %w", term, err)
		}
	}
	f.newest = term
	return nil
}

// raise takes term, which the leading coordinator has told in a reply to
// this node's join or heartbeat, as the newest if it is newer, as admit
// would: a deposed coordinator that has not called since is refused from
// its first call on.
func (f *fence) raise(term agentv1.Term) error {
	if err := f.admit(term); err != nil && !errors.Is(err, errStaleTerm) {
		return err
	}
	return nil
}

// sawTerm raises the fence to the term the leading coordinator told in a
// reply ("": none).
func (s *Server) sawTerm(term string) {
	if term == "" {
		return
	}
	t, err := agentv1.ParseTerm(term)
	if err != nil {
		s.log().Warn("coordinator told a term that is not one", "term", term)
		return
	}
	s.init()
	if err := s.api.fence.raise(t); err != nil {
		s.log().Error("record coordinator term", "err", err)
	}
}
