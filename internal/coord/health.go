package coord

import (
	"context"
	"slices"
	"strings"

	coordv1 "cairn/api/coord/v1"
	evv1 "cairn/api/events/v1"
	"cairn/internal/coord/policy"
)

// noteHealth records what a node's heartbeat says of its health probes:
// a change is written to the node's record and published, and a node that
// turns unwell has each job with ranks on it act by its OnHealthWarning
// policy.
func (nr *nodeReports) noteHealth(ctx context.Context, node string, warnings []string) {
	c := nr.c
	c.mu.Lock()
	if c.health == nil {
		c.health = map[string][]string{}
	}
	old, known := c.health[node]
	c.health[node] = warnings
	c.mu.Unlock()
	if known && slices.Equal(old, warnings) {
		return
	}
	var n coordv1.Node
	err := c.cat.Update(ctx, nodeKey(node), &n, func() error {
		n.Health = warnings
		return nil
	})
	if err != nil {
		c.log.Warn("record node health", "node", node, "err", err)
	}
	if len(warnings) == 0 {
		if known && len(old) > 0 {
			c.log.Info("node healthy again", "node", node)
			c.publish(evv1.Event{Type: evv1.HealthOK, Node: node})
		}
		return
	}
	c.log.Warn("node unwell", "node", node, "probes", strings.Join(warnings, "; "))
	c.publish(evv1.Event{Type: evv1.HealthWarning, Node: node, Message: strings.Join(warnings, "; ")})
	if len(old) == 0 {
		c.sup.observe(policy.NodeUnwell{Node: node})
	}
}

// noteQuarantine publishes each damaged pack a node reports in its store's
// quarantine/ once: those not yet in the node's record are published and
// recorded.
func (nr *nodeReports) noteQuarantine(ctx context.Context, node string, packs []string) {
	c := nr.c
	c.mu.Lock()
	if c.quarantined == nil {
		c.quarantined = map[string][]string{}
	}
	old, known := c.quarantined[node]
	c.mu.Unlock()
	if known && slices.Equal(old, packs) {
		return
	}
	var fresh []string
	var n coordv1.Node
	err := c.cat.Update(ctx, nodeKey(node), &n, func() error {
		fresh = fresh[:0]
		for _, p := range packs {
			if !slices.Contains(n.Quarantined, p) {
				fresh = append(fresh, p)
			}
		}
		n.Quarantined = packs
		return nil
	})
	if err != nil {
		c.log.Warn("record node quarantine", "node", node, "err", err)
		return
	}
	c.mu.Lock()
	c.quarantined[node] = packs
	c.mu.Unlock()
	for _, p := range fresh {
		c.log.Warn("a node's store quarantined a damaged pack", "node", node, "pack", p)
		c.publish(evv1.Event{Type: evv1.StoreQuarantined, Node: node, Message: p})
	}
}
