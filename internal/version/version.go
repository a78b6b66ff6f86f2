package version

import (
	"cmp"
	"runtime"
	"runtime/debug"
)

// API is the version of the agent and coordinator APIs.
const API = "v1"

// Version and Revision are set by the Makefile (-ldflags -X): Version
// from the newest tag (git describe: v0.9.0, or v0.9.0-3-gabcdef012345
// three commits after it, -dirty with changes), Revision for builds
// without VCS stamping. Without them, Version is the module version the
// Go toolchain stamped (a tag, or a pseudo-version).
var Version, Revision string

// Info is what `cairn version` prints.
type Info struct {
	Version  string `json:"version"`            // the module version, or "devel"
	Revision string `json:"revision,omitempty"` // the VCS revision built from
	Modified bool   `json:"modified,omitempty"` // built from a tree with changes
	Go       string `json:"go"`
	API      string `json:"api"` // the agent and coordinator API version
}

// Get returns this binary's Info.
func Get() Info {
	v := Info{Version: cmp.Or(Version, "devel"), Revision: Revision, Go: runtime.Version(), API: API}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// String is one line: cairn VERSION (REVISION[, modified]), GO, API V.
func (v Info) String() string {
	s := "cairn " + v.Version
	if v.Revision != "" {
		s += " (" + v.Revision
		if len(v.Revision) > 12 {
			s = s[:len(s)-len(v.Revision)+12]
		}
		if v.Modified {
			s += ", modified"
		}
		s += ")"
	}
	return s + ", " + v.Go + ", API " + v.API
}
