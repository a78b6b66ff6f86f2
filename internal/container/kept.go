package container

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/store"
)

// A container's newest image stays in staging after its checkpoint is
// committed, as the staged image it was ingested from, when
// Options.KeepImages allows: a restore of that checkpoint on this node (a
// job restarted where its ranks were, a failed migration) then takes it
// from memory instead of reading and verifying the store. One image per
// container; the oldest are dropped to keep the total under the budget. A
// restore takes the kept image away (renames it into its own staging
// dir, which it uses up), so a kept image serves once.
//
// A kept image is what CRIU and the fs capture wrote, the same files the
// store ingested and hashed; it lives in root-only memory that no
// container sees, like the staging dir every restore uses. It is used only
// for the exact checkpoint it was kept for: its note names the container,
// checkpoint number and manifest, and the catalog's record must agree.

// keptDir is where kept images live, one dir per container.
const keptDir = "kept"

// keptNote says which checkpoint a kept image is.
type keptNote struct {
	Container string   `json:"container"`
	Seq       int      `json:"seq"`
	Manifest  store.ID `json:"manifest"`
	Bytes     int64    `json:"bytes"`
}

const keptNoteName = "kept.json"

func (m *Manager) keptPath(name string) string {
	return filepath.Join(m.opts.StagingDir, keptDir, name)
}

// keepImage keeps the staged image dir of checkpoint rec, just committed,
// as name's kept image if the budget allows, replacing name's earlier one
// and dropping the oldest of other containers' as needed. It reports
// whether it kept it; dir is gone if so. The caller holds name's lock.
func (m *Manager) keepImage(name string, rec *image.Record, dir string) bool {
	budget := m.opts.KeepImages
	if budget <= 0 {
		return false
	}
	size, err := dirSize(dir)
	if err != nil || size > budget {
		return false
	}
	root := filepath.Join(m.opts.StagingDir, keptDir)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return false
	}
	dst := m.keptPath(name)
	_ = os.RemoveAll(dst)
	// Make room, oldest first.
	kept := m.keptImages()
	var total int64
	for _, k := range kept {
		total += k.Bytes
	}
	for len(kept) > 0 && total+size > budget {
		total -= kept[0].Bytes
		_ = os.RemoveAll(m.keptPath(kept[0].Container))
		kept = kept[1:]
	}
	note, _ := json.Marshal(keptNote{Container: name, Seq: rec.Seq, Manifest: rec.Manifest, Bytes: size})
	if err := os.WriteFile(filepath.Join(dir, keptNoteName), note, 0o600); err != nil {
		return false
	}
	if err := os.Rename(dir, dst); err != nil {
		return false
	}
	return true
}

// keptImage is a kept image and when it was kept.
type keptImage struct {
	keptNote
	at time.Time
}

// keptImages lists the kept images, oldest first.
func (m *Manager) keptImages() []keptImage {
	ents, _ := os.ReadDir(filepath.Join(m.opts.StagingDir, keptDir))
	var out []keptImage
	for _, e := range ents {
		p := filepath.Join(m.opts.StagingDir, keptDir, e.Name(), keptNoteName)
		b, err := os.ReadFile(p)
		fi, serr := os.Stat(p)
		var k keptImage
		if err != nil || serr != nil || json.Unmarshal(b, &k.keptNote) != nil || k.Container != e.Name() {
			// Not a whole kept image (a crash while keeping it): drop it.
			_ = os.RemoveAll(filepath.Join(m.opts.StagingDir, keptDir, e.Name()))
			continue
		}
		k.at = fi.ModTime()
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b keptImage) int { return a.at.Compare(b.at) })
	return out
}

// takeKept moves name's kept image into dir (which must not exist) if it
// is checkpoint rec, and reports whether it did. A kept image of another
// checkpoint is left alone.
func (m *Manager) takeKept(name string, rec *image.Record, dir string) bool {
	if m.opts.KeepImages <= 0 {
		return false
	}
	src := m.keptPath(name)
	b, err := os.ReadFile(filepath.Join(src, keptNoteName))
	if err != nil {
		return false
	}
	var n keptNote
	if json.Unmarshal(b, &n) != nil || n.Container != name || n.Seq != rec.Seq || n.Manifest != rec.Manifest {
		return false
	}
	// The caller holds name's lock: no commit replaces it meanwhile.
	return os.Rename(src, dir) == nil
}

// dropKept removes name's kept image, if any.
func (m *Manager) dropKept(name string) error {
	if err := os.RemoveAll(m.keptPath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("drop kept image of %s: %w", name, err)
	}
	return nil
}
