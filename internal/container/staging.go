package container

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/cairn-hpc/cairn/internal/proc"
)

// ErrUnsafeDir is returned (wrapped) for a dir cairn would keep images in
// that someone else could read or change: not owned by this user (root),
// open to others, a symlink, or below a dir others may write into without
// the sticky bit. Nothing is put there.
var ErrUnsafeDir = errors.New("unsafe working dir")

// StagingRoot makes the staging dir if it is not there, root-only (mode
// 0700), and returns it; an existing one that is unsafe (ErrUnsafeDir) is
// refused: a local user who made it first could read and change the
// memory images CRIU writes into it before they are stored, and kept
// images would be restored from it unchecked.
func (m *Manager) StagingRoot() (string, error) {
	dir := m.opts.StagingDir
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return "", fmt.Errorf("staging dir: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("staging dir: %w", err)
	}
	if err := safeDir(dir); err != nil {
		return "", err
	}
	return dir, nil
}

// safeDir checks that dir is a real dir of this user's, closed to others,
// and that no dir above it lets others replace it: each is this user's
// or root's, and open to others' writes only if sticky.
func safeDir(dir string) error {
	uid := uint32(os.Geteuid())
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !ok:
		return fmt.Errorf("%s: no owner to check", dir)
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%w: %s is a symlink, which another user may have made or may change; remove it or choose another dir", ErrUnsafeDir, dir)
	case !fi.IsDir():
		return fmt.Errorf("%w: %s is not a directory; remove it or choose another dir", ErrUnsafeDir, dir)
	case st.Uid != uid:
		return fmt.Errorf("%w: %s is owned by uid %d, not by cairn's (uid %d): whoever made it could read and change the images in it; look at what it holds, remove it, or choose another dir", ErrUnsafeDir, dir, st.Uid, uid)
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("%w: %s has mode %04o, open to other users: make it 0700 (chmod 700 %s) or remove it", ErrUnsafeDir, dir, fi.Mode().Perm(), dir)
	}
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		if st == nil || st.Uid != uid && st.Uid != 0 || fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
			return fmt.Errorf("%w: %s is in %s, which another user may change (owner uid %d, mode %s): they could replace it", ErrUnsafeDir, dir, p, st.Uid, fi.Mode())
		}
		if p == "/" {
			return nil
		}
	}
}

// stagingOwner is the file in a staging dir that lists the pids using it.
const stagingOwner = "owner"

// cleanStaging removes staging dirs that checkpoints of processes that no
// longer exist left behind: they may hold a whole memory image in tmpfs. A
// dir is kept while any process its owner file names still runs: an
// orphaned runc and CRIU may still be dumping into it.
//
// So are the new upper dirs of restores whose process died before it
// took them into the container's dir (containers/.restore-NAME-pidPID-*):
// a copy of an image's file changes, which the image still holds.
func (m *Manager) cleanStaging() {
	var dirs []string
	ents, _ := os.ReadDir(m.opts.StagingDir)
	for _, e := range ents {
		dirs = append(dirs, filepath.Join(m.opts.StagingDir, e.Name()))
	}
	containers := filepath.Join(m.opts.DataDir, "containers")
	ents, _ = os.ReadDir(containers)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), restoreUpperPrefix) {
			dirs = append(dirs, filepath.Join(containers, e.Name()))
		}
	}
	for _, dir := range dirs {
		name := filepath.Base(dir)
		i := strings.LastIndex(name, "-pid")
		if i < 0 {
			continue
		}
		owners := []string{strings.SplitN(name[i+4:], "-", 2)[0]}
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
