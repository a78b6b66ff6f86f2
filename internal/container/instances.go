// Every cairn instance on a host (a data dir: a node's agent, a local
// cluster's nodes, the CLI's single containers) hides its dirs from the
// containers of every other instance too: each lists its dirs in a
// root-only registry under /run (itself hidden from containers), and a
// container's root masks what all of them list.

package container

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// InstancesDir is the host's registry of cairn instances, one file an
// instance naming its dirs. Not under /run/cairn: a program of the rank
// API's run on the host takes that dir's presence for being in a rank
// whose socket is away for a dump, and waits for it. A variable for tests.
var InstancesDir = "/run/cairn-instances"

// instanceRecord is what an instance lists: its data dir first, then its
// staging dir and what it hides besides (its Options.Hide: a cluster's
// credentials).
type instanceRecord struct {
	Dirs []string `json:"dirs"`
}

// register lists this instance's dirs in the registry, and drops the
// records of instances whose data dir is gone.
func (m *Manager) register() error {
	if err := os.MkdirAll(InstancesDir, 0o700); err != nil {
		return err
	}
	if err := safeDir(InstancesDir); err != nil {
		return err
	}
	rec := instanceRecord{Dirs: append([]string{m.opts.DataDir, m.opts.StagingDir}, m.opts.Hide...)}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	p := filepath.Join(InstancesDir, m.instance+".json")
	tmp, err := os.CreateTemp(InstancesDir, ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return err
	}
	pruneInstances(m.instance)
	return nil
}

// Unregister drops this instance's record from the registry: its data
// dir is about to go for good (`cairn down`), and other instances need
// not hide it any longer.
func (m *Manager) Unregister() error {
	err := os.Remove(filepath.Join(InstancesDir, m.instance+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// Registered reports whether the registry holds a record of an instance
// whose data dir is dataDir.
func Registered(dataDir string) bool {
	for _, in := range instances("") {
		if in.dirs[0] == filepath.Clean(dataDir) {
			return true
		}
	}
	return false
}

// instance is another instance's record in the registry.
type instance struct {
	file string
	dirs []string // absolute and clean, "/" left out; the data dir first
}

// gone reports whether the instance's data dir no longer exists.
func (in instance) gone() bool {
	_, err := os.Stat(in.dirs[0])
	return errors.Is(err, fs.ErrNotExist)
}

// otherInstances returns the dirs the registry lists for live instances
// other than self.
func otherInstances(self string) []string {
	var out []string
	for _, in := range instances(self) {
		if !in.gone() {
			out = append(out, in.dirs...)
		}
	}
	return out
}

// pruneInstances drops from the registry the records of instances other
// than self whose data dir is gone.
func pruneInstances(self string) {
	for _, in := range instances(self) {
		if in.gone() {
			os.Remove(in.file)
		}
	}
}

// instances reads the registry's records of instances other than self;
// unreadable ones are left out.
func instances(self string) []instance {
	ents, err := os.ReadDir(InstancesDir)
	if err != nil {
		return nil
	}
	var out []instance
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || id == self {
			continue
		}
		p := filepath.Join(InstancesDir, e.Name())
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var rec instanceRecord
		if json.Unmarshal(b, &rec) != nil || len(rec.Dirs) == 0 || !filepath.IsAbs(rec.Dirs[0]) {
			continue
		}
		in := instance{file: p}
		for _, d := range rec.Dirs {
			if filepath.IsAbs(d) && filepath.Clean(d) != "/" {
				in.dirs = append(in.dirs, filepath.Clean(d))
			}
		}
		if len(in.dirs) > 0 {
			out = append(out, in)
		}
	}
	return out
}
