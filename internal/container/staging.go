package container

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"cairn/internal/proc"
)

// stagingOwner is the file in a staging dir that lists the pids using it.
const stagingOwner = "owner"

// cleanStaging removes staging dirs that checkpoints of processes that no
// longer exist left behind: they may hold a whole memory image in tmpfs. A
// dir is kept while any process its owner file names still runs: an
// orphaned runc and CRIU may still be dumping into it.
func (m *Manager) cleanStaging() {
	ents, _ := os.ReadDir(m.opts.StagingDir)
	for _, e := range ents {
		i := strings.Index(e.Name(), "-pid")
		if i < 0 {
			continue
		}
		dir := filepath.Join(m.opts.StagingDir, e.Name())
		owners := []string{strings.SplitN(e.Name()[i+4:], "-", 2)[0]}
		if b, err := os.ReadFile(filepath.Join(dir, stagingOwner)); err == nil {
			owners = append(owners, strings.Fields(string(b))...)
		}
		live := false
		for _, o := range owners {
			if pid, err := strconv.Atoi(o); err != nil || pid == os.Getpid() || proc.Runs(pid) {
				live = true // unparsable: leave it alone
			}
		}
		if !live {
			os.RemoveAll(dir)
		}
	}
}

// StagingUsage returns the bytes of the files in the staging dir and, of
// them, those of the images kept after their checkpoint. A file that goes
// away while they are counted is not counted.
func (m *Manager) StagingUsage() (used, kept int64) {
	return filesSize(m.opts.StagingDir), filesSize(filepath.Join(m.opts.StagingDir, keptDir))
}

// filesSize sums the sizes of the regular files under dir, skipping what
// it cannot read.
func filesSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			n += fi.Size()
		}
		return nil
	})
	return n
}
