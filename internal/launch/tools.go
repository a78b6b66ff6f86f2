package launch

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// InstallTools puts the tools an MPI rank needs (the cairn binary exe, and
// the MPICH library fix if it exists) into a directory of root named by
// their content, and returns that directory; it is mounted read-only at
// ToolsMount in every rank of an MPI job.
//
// Naming it by content makes the same build land at the same path on every
// node, which a rank restored on another node needs (its restored launch
// daemon maps that very binary), and keeps the tools of older builds for
// the checkpoints that still use them. Installing what is already there
// costs a hash of the files.
func InstallTools(root, exe, fix string) (string, error) {
	files := map[string]string{"cairn": exe}
	if fix != "" {
		if _, err := os.Stat(fix); err == nil {
			files[MPICHFix] = fix
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
	}
	h := sha256.New()
	for _, name := range []string{"cairn", MPICHFix} {
		src, ok := files[name]
		if !ok {
			continue
		}
		f, err := os.Open(src)
		if err != nil {
			return "", fmt.Errorf("tools: %w", err)
		}
		fmt.Fprintf(h, "%s\x00", name)
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", fmt.Errorf("tools: %w", err)
		}
	}
	dir := filepath.Join(root, hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(filepath.Join(dir, "cairn")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(root, ".new-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for name, src := range files {
		if err := copyFile(src, filepath.Join(tmp, name)); err != nil {
			return "", fmt.Errorf("tools: %w", err)
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "cairn")); serr == nil {
			return dir, nil // another agent of this host installed it first
		}
		return "", err
	}
	return dir, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
