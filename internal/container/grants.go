// What a container's config grants it on the host (volumes, a root, the
// rank API, limits) is checked by one set of rules, whether the config
// comes from the caller of Run or from an image's record. A record is
// read from a file or sent by a peer: it grants nothing by itself. Import
// and receive refuse a record whose config breaks the rules that need no
// host (CheckRecordedConfig, as image.Repo.CheckConfig), and Restore
// checks it again with the host's rules, taking the network namespace and
// the tools dir from its caller, never from the record.

package container

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
)

// hostOnly are host trees no volume and no root may come from: the
// kernel's and the devices' views of the host (another container's
// memory through /proc/PID/mem, the host's core_pattern, a freezer).
var hostOnly = []string{"/proc", "/sys", "/dev"}

// CheckRecordedConfig checks the container config recorded in an image
// (image.Record.Config) by the rules that need no host: what a crafted
// file could ask for that Run never grants. It is image.Repo.CheckConfig
// for a Manager's repo.
func CheckRecordedConfig(raw json.RawMessage) error {
	if len(raw) == 0 {
		return nil // grants nothing
	}
	var cfg imageConfig
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return checkGrants(cfg.Config)
}

// checkGrants checks what cfg grants by the rules that need no host.
func checkGrants(cfg Config) error {
	if cfg.RootFS != "" {
		if !filepath.IsAbs(cfg.RootFS) || filepath.Clean(cfg.RootFS) != cfg.RootFS {
			return fmt.Errorf("%w: rootfs %s: want an absolute, clean path", ErrBadConfig, cfg.RootFS)
		}
		if under(cfg.RootFS, hostOnly...) {
			return fmt.Errorf("%w: rootfs %s: a root may not come from %s", ErrBadConfig, cfg.RootFS, strings.Join(hostOnly, ", "))
		}
	}
	for _, v := range cfg.Volumes {
		switch {
		case !filepath.IsAbs(v.Host) || filepath.Clean(v.Host) != v.Host:
			return fmt.Errorf("%w: volume %s: the host path must be absolute and clean", ErrBadConfig, v.Host)
		case v.Host == "/":
			return fmt.Errorf("%w: volume %s: the host's whole root may not be a volume", ErrBadConfig, v.Host)
		case under(v.Host, hostOnly...):
			return fmt.Errorf("%w: volume %s: a volume may not come from %s", ErrBadConfig, v.Host, strings.Join(hostOnly, ", "))
		case !filepath.IsAbs(v.Path) || filepath.Clean(v.Path) != v.Path || v.Path == "/":
			return fmt.Errorf("%w: volume %s:%s: the container path must be absolute, clean and not /", ErrBadConfig, v.Host, v.Path)
		case under(v.Path, append(hostOnly, ToolsMount)...):
			return fmt.Errorf("%w: volume %s:%s: %s is the container's own", ErrBadConfig, v.Host, v.Path, v.Path)
		}
	}
	if err := checkAPIConfig(cfg); err != nil {
		return err
	}
	if cfg.CPUs < 0 || cfg.Memory < 0 || cfg.Memory > 0 && cfg.Memory < 4<<20 {
		return fmt.Errorf("%w: cpus %g, memory %d bytes: want positive limits, memory at least 4 MiB", ErrBadConfig, cfg.CPUs, cfg.Memory)
	}
	return nil
}

// under tells whether p is one of dirs or below one.
func under(p string, dirs ...string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}
