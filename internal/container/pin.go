package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// A volume's host path is checked (checkVolumes) and then mounted by runc,
// which resolves it again: a local user who owns a directory on the path
// could swap it for a symlink in between, and the container would get
// what the symlink points at (the data dir, /proc). So cairn opens each
// checked path itself, without following any symlink, binds what it
// opened at a path only root reaches (the container's dir, "pins/I"), and
// gives runc that path. What runc mounts is then the very directory that
// was checked. The pins are unmounted once runc has made the container's
// own mounts, which do not depend on them.

// pinsDir is the dir of a container's pinned volumes.
const pinsDir = "pins"

// pinVolumes pins vs, whose host paths checkVolumes resolved, under the
// container dir dir, and returns them with their pins as host paths, and
// what unmounts the pins.
func pinVolumes(vs []Volume, dir string) (pinned []Volume, unpin func(), err error) {
	unpin = func() { unpinVolumes(dir) }
	if len(vs) == 0 {
		return vs, unpin, nil
	}
	unpin()
	defer func() {
		if err != nil {
			unpin()
		}
	}()
	if err := os.MkdirAll(filepath.Join(dir, pinsDir), 0o700); err != nil {
		return nil, unpin, err
	}
	for i, v := range vs {
		target := filepath.Join(dir, pinsDir, strconv.Itoa(i))
		if err := pinVolume(v.Host, target); err != nil {
			return nil, unpin, err
		}
		v.Host = target
		pinned = append(pinned, v)
	}
	return pinned, unpin, nil
}

// pinVolume binds the directory at the resolved path host at target.
func pinVolume(host, target string) error {
	fd, err := unix.Openat2(unix.AT_FDCWD, host, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%w: volume %s changed since it was checked: a symlink is on its path now", ErrBadConfig, host)
	case err != nil:
		return fmt.Errorf("%w: volume %s: %v", ErrBadConfig, host, err)
	}
	defer unix.Close(fd)
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return fmt.Errorf("volume %s: %w", host, err)
	}
	if name, ok := kernelFS[int64(fs.Type)]; ok {
		return fmt.Errorf("%w: volume %s is on %s, the kernel's view of the host, which may not be a volume", ErrBadConfig, host, name)
	}
	if err := os.Mkdir(target, 0o700); err != nil {
		return err
	}
	// The descriptor's magic link is the opened directory itself.
	if err := unix.Mount("/proc/self/fd/"+strconv.Itoa(fd), target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("pin volume %s: %w", host, err)
	}
	if err := unix.Mount("", target, "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("pin volume %s: %w", host, err)
	}
	return nil
}

// unpinVolumes unmounts and removes the pins under the container dir dir,
// those of a start that died half-way included. A pin that stays mounted
// is left in place: removing it would delete what is in the volume.
func unpinVolumes(dir string) {
	pins := filepath.Join(dir, pinsDir)
	ents, err := os.ReadDir(pins)
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join(pins, e.Name())
		for unix.Unmount(p, unix.MNT_DETACH) == nil {
		}
		_ = os.Remove(p) // only empty: never the volume's files
	}
	_ = os.Remove(pins)
}

// removeDir removes a container dir: its pins first, unmounted, so that
// nothing of a volume is ever removed with it.
func removeDir(dir string) error {
	unpinVolumes(dir)
	if _, err := os.Stat(filepath.Join(dir, pinsDir)); err == nil {
		return fmt.Errorf("remove %s: a volume is still mounted in %s", dir, filepath.Join(dir, pinsDir))
	}
	return os.RemoveAll(dir)
}
