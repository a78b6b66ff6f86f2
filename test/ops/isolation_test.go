package ops

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestRankIsolation runs a job whose rank looks for what it must not see
// or reach: the cluster's CA key, its node's credentials, data and staging
// dirs, another node's data, and the agent and coordinator listeners. It
// prints SEEN for each it finds; there must be none.
func TestRankIsolation(t *testing.T) {
	c := testutil.NewCluster(t, 2)
	f := c.File()
	cl := filepath.Join(c.Data, "cluster")
	var script strings.Builder
	look := func(p string) { fmt.Fprintf(&script, "[ -e %q ] && echo 'SEEN %s'\n", p, p) }
	look(filepath.Join(cl, "pki", "ca.key"))
	look(filepath.Join(cl, "client"))
	for _, n := range f.Nodes {
		look(filepath.Join(cl, "nodes", n.Name, "creds"))
		look(n.Data)
		look(n.Staging)
	}
	look("/etc/shadow")
	look("/run/netns")
	reach := []string{f.Coordinator}
	for _, n := range f.Nodes {
		reach = append(reach, n.Addr)
	}
	for _, a := range reach {
		host, port, _ := strings.Cut(a, ":")
		fmt.Fprintf(&script, "timeout 3 bash -c 'exec 3<>/dev/tcp/%s/%s' 2>/dev/null && echo 'SEEN %s'\n", host, port, a)
	}
	script.WriteString("echo DONE; sleep 600\n")
	c.OK("run", "--job", "spy", "--ranks", "2", "--per-node", "1", "--", "sh", "-c", script.String())
	for r := range 2 {
		var out string
		testutil.WaitUntil(t, 60*time.Second, func() (bool, string) {
			out = c.Logs("spy", r)
			return strings.Contains(out, "DONE"), "rank output: " + out
		})
		if strings.Contains(out, "SEEN") {
			t.Errorf("rank %d sees what it must not:\n%s", r, out)
		}
	}
	c.OK("rm", "-f", "spy")
}
