package deploy

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// TestCatalogBackupRestore: a backup taken while a job runs, then a
// coordinator whose state is lost: `cairn catalog restore` makes a new
// state dir from the backup, and a coordinator started on it takes the
// cluster over. The nodes join it, the job and its checkpoint are the
// backup's, the event history goes on where it was, a checkpoint taken
// after the backup (its number reused by the restored catalog) costs one
// aborted round at most, the next checkpoint commits and the job ends
// with an uninterrupted run's result. A file that is no backup, and a
// directory that holds a coordinator's state, are refused.
func TestCatalogBackupRestore(t *testing.T) {
	c := testutil.NewCluster(t, 2)
	messages := 3 * testutil.RingMessages
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "2", "--per-node", "1"}, c.RingArgs(messages)...)...)
	c.WaitProgress("ring", 2, 0, 60*time.Second)
	c.OK("checkpoint", "ring")

	backup := filepath.Join(t.TempDir(), "cairn.backup")
	var info struct {
		Keys, Events int
		Cluster      string
	}
	if err := json.Unmarshal([]byte(c.OK("catalog", "backup", "-o", backup, "--json")), &info); err != nil || info.Keys == 0 || info.Events == 0 || info.Cluster == "" {
		t.Fatalf("catalog backup --json: %+v %v", info, err)
	}
	c.OK("checkpoint", "ring") // after the backup: not in it

	// The coordinator's state is lost; a new one is made from the backup.
	dir := filepath.Join(t.TempDir(), "restored")
	out, err := exec.Command(c.Bin, "catalog", "restore", backup, "--dir", dir).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "start the coordinator with --dir "+dir) {
		t.Fatalf("catalog restore: %v\n%s", err, out)
	}
	if out, err := exec.Command(c.Bin, "catalog", "restore", backup, "--dir", dir).CombinedOutput(); err == nil || !strings.Contains(string(out), "exists") {
		t.Errorf("a restore over a coordinator's state: %v\n%s", err, out)
	}
	if out, err := exec.Command(c.Bin, "catalog", "restore", "/etc/passwd", "--dir", t.TempDir()).CombinedOutput(); err == nil || !strings.Contains(string(out), "not a cairn backup") {
		t.Errorf("a restore of /etc/passwd: %v\n%s", err, out)
	}
	c.LaunchCoordinatorAsUnit([]string{c.Bin, "coordinator"}, "CAIRN_COORDINATOR_DIR="+dir)
	c.WaitNodes(2, 30*time.Second)

	if j := c.Job("ring"); j.State != "running" || j.Restarts != 0 {
		t.Fatalf("after the restore, ring is %s with %d restarts (%s)", j.State, j.Restarts, j.Reason)
	}
	if cks := c.Ckpts("ring"); len(cks) != 1 || cks[0].Seq != 1 {
		t.Fatalf("after the restore, checkpoints %+v; want the backup's one, 1", cks)
	}
	if ev := c.OK("events", "--json"); !strings.Contains(ev, `"job.started"`) {
		t.Errorf("the event history lost what came before the backup:\n%s", ev)
	}
	// Checkpoint 2, taken after the backup, is on the nodes but not in
	// the catalog: its number comes again.
	var taken bool
	for range 2 {
		out, err := c.Run("checkpoint", "ring")
		if err == nil {
			taken = true
			break
		}
		t.Logf("a checkpoint on the restored catalog: %v\n%s", err, out)
	}
	if !taken {
		t.Fatal("no checkpoint commits on the restored catalog")
	}
	newest := 0
	for _, ck := range c.Ckpts("ring") {
		if ck.State == "durable" || ck.State == "protected" {
			newest = max(newest, ck.Seq)
		}
	}
	if newest <= 2 {
		t.Errorf("newest checkpoint %d: a number the nodes held already", newest)
	}
	if got, want := c.Result("ring"), ringapp.Expected(2, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
}
