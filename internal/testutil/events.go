package testutil

import (
	"encoding/json"
	"strings"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
)

// Events is `cairn events --json` with args (--job, --type, ...): the
// cluster's events so far, oldest first.
func (c *Cluster) Events(args ...string) []evv1.Event {
	c.t.Helper()
	var out []evv1.Event
	for _, line := range strings.Split(strings.TrimSpace(c.OK(append([]string{"events", "--json"}, args...)...)), "\n") {
		if line == "" {
			continue
		}
		var e evv1.Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			c.t.Fatalf("event %q: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}

// MigrationPhases is the order of a migration's events.
var MigrationPhases = []string{evv1.MigrationStarted, evv1.MigrationStalled, evv1.MigrationMoved, evv1.MigrationRestored, evv1.MigrationDone}

// Migrate is `cairn migrate --json` with args (JOB/RANK, --to NODE): it
// returns the migration's record once it ended, and logs its figures.
func (c *Cluster) Migrate(args ...string) coordv1.Migration {
	c.t.Helper()
	var m coordv1.Migration
	if err := json.Unmarshal([]byte(c.OK(append([]string{"migrate", "--json"}, args...)...)), &m); err != nil {
		c.t.Fatal(err)
	}
	c.t.Logf("rank %d %s -> %s: %s, job stalled %s, %d bytes moved in %s, restored in %s", m.Rank, m.From, m.To, m.State,
		m.Stall.Round(time.Millisecond), m.Bytes, m.Move.Round(time.Millisecond), m.Restore.Round(time.Millisecond))
	return m
}
