// Terms fence coordinators: each takes a number from the catalog as it
// starts, larger than every earlier coordinator's, and every call it
// makes to an agent carries it (agentv1.TermHeader). An agent refuses a
// call from an older term than the newest it has seen, so a coordinator
// that another replaced, but that still runs (paused, cut off from the
// catalog, or simply started twice by mistake), can never act on a job
// once its successor has. The catalog's random id goes with the number:
// a catalog made anew (its etcd lost) counts again from 1, and its terms
// are not older than the lost one's.

package coord

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
)

// termKey holds the newest coordinator term given out.
const termKey = "counters/term"

// termRecord is what termKey holds.
type termRecord struct {
	N       uint64 `json:"n"`
	Catalog string `json:"catalog"` // random, made with the first term
}

// fence takes the coordinator's term and watches for a newer one.
type fence struct{ c *Coordinator }

// takeTerm gives the coordinator the next term. Without the catalog it
// keeps none, which agents that have seen a term of the catalog do not
// take for newer: such a coordinator can do nothing anyway.
func (fe *fence) takeTerm(ctx context.Context) {
	c := fe.c
	var rec termRecord
	first := func() {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		rec = termRecord{N: 1, Catalog: hex.EncodeToString(b)}
	}
	if err := c.rec.advance(ctx, termKey, &rec, func() { rec.N++ }, first); err != nil {
		c.log.Error("no coordinator term from the catalog: agents will refuse this coordinator", "err", err)
		return
	}
	c.agents.term = agentv1.Term{N: rec.N, Catalog: rec.Catalog}
	c.log.Info("coordinator term", "term", c.agents.term.String())
}

// Term is the coordinator's term (zero until Start has taken one).
func (c *Coordinator) Term() agentv1.Term { return c.agents.term }

// termString is the term as replies to agents tell it ("": none yet).
func (fe *fence) termString() string {
	c := fe.c
	if c.agents.term.N == 0 {
		return ""
	}
	return c.agents.term.String()
}

// watchTerm looks at the catalog's newest term every half node lease:
// once a newer coordinator has taken one, this one has been replaced, and
// it ends its own work (periodic rounds, recoveries, failure handling),
// which the agents would refuse anyway, and which would clutter the
// catalog with rounds that abort. It goes on answering: a request sent to
// it is refused by the agents (stale_term), and joins and heartbeats keep
// the nodes' leases alive for its successor.
func (fe *fence) watchTerm(ctx context.Context) {
	c := fe.c
	t := time.NewTicker(c.opts.NodeTTL / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var rec termRecord
		if _, err := c.cat.Get(ctx, termKey, &rec); err != nil {
			continue
		}
		newer := agentv1.Term{N: rec.N, Catalog: rec.Catalog}
		if c.agents.term.N == 0 || !c.agents.term.Older(newer) {
			continue
		}
		c.replaced.Store(&newer)
		c.log.Error("a newer coordinator has started: this one stops its own work; the agents refuse its calls", "term", c.agents.term.String(), "newer", newer.String())
		c.depose()
		return
	}
}

// Replaced returns the newer term that replaced this coordinator, if one
// has (watchTerm).
func (c *Coordinator) Replaced() (agentv1.Term, bool) {
	if t := c.replaced.Load(); t != nil {
		return *t, true
	}
	return agentv1.Term{}, false
}
