package testutil

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/testbed"
)

// Clusters of several coordinators (`cairn up --coordinators N`).

// Coordinators lists the cluster's coordinators as `cairn coordinators`
// does.
func (c *Cluster) Coordinators() ([]coordv1.Coordinator, error) {
	out, err := c.Run("coordinators", "--json")
	if err != nil {
		return nil, fmt.Errorf("cairn coordinators: %v: %s", err, out)
	}
	var list []coordv1.Coordinator
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("cairn coordinators: %v: %s", err, out)
	}
	return list, nil
}

// WaitLeader waits until a coordinator other than those named in not
// leads, and returns it as cluster.json records it, with its term.
func (c *Cluster) WaitLeader(within time.Duration, not ...string) (testbed.Coord, string) {
	c.t.Helper()
	var leader coordv1.Coordinator
	WaitUntil(c.t, within, func() (bool, string) {
		list, err := c.Coordinators()
		if err != nil {
			return false, err.Error()
		}
		for _, co := range list {
			if co.Leader && !slices.Contains(not, co.Name) {
				leader = co
				return true, ""
			}
		}
		return false, fmt.Sprintf("no coordinator but %v leads: %+v", not, list)
	})
	co, _ := c.coord(leader.Name)
	return co, leader.Term
}

// CoordLog is what the coordinator named name has logged so far.
func (c *Cluster) CoordLog(name string) string {
	c.t.Helper()
	co, _ := c.coord(name)
	b, err := os.ReadFile(co.Log())
	if err != nil {
		c.t.Fatal(err)
	}
	return string(b)
}

// WaitCoordLog waits until the coordinator named name has logged substr
// more than before times.
func (c *Cluster) WaitCoordLog(name, substr string, before int, within time.Duration) {
	c.t.Helper()
	WaitUntil(c.t, within, func() (bool, string) {
		n := strings.Count(c.CoordLog(name), substr)
		return n > before, fmt.Sprintf("coordinator %s logged %q %d times, %d before", name, substr, n, before)
	})
}

// Signal sends sig to the coordinator named name (SIGSTOP, SIGCONT).
func (c *Cluster) Signal(name string, sig syscall.Signal) {
	c.t.Helper()
	co, _ := c.coord(name)
	if err := syscall.Kill(co.PID, sig); err != nil {
		c.t.Fatal(err)
	}
}
