package agent

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/lazy"
)

// stagedAt is a prepared rank whose staged image is in dir.
type stagedAt struct {
	fakeStaged
	dir string
}

func (s *stagedAt) ImageDir() string { return s.dir }

// TestDonor: a donor opens the pages files of a prepared rank's staged
// image for the agent that first reads them and keeps serving them after
// the staging dir is gone (the rank moved away post-copy), until that
// agent drops it; another agent may neither read nor drop them; an image
// with no prepare here is not found.
func TestDonor(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "criu"), 0o700); err != nil {
		t.Fatal(err)
	}
	pages := bytes.Repeat([]byte{1}, lazy.PageSize)
	pages = append(pages, bytes.Repeat([]byte{2}, lazy.PageSize)...)
	pages = append(pages, bytes.Repeat([]byte{3}, lazy.PageSize)...)
	if err := os.WriteFile(filepath.Join(dir, "criu", "pages-1.img"), pages, 0o600); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "criu", "core-1.img"), []byte("core"), 0o600)
	key := ckptKey{"j.1", 4}
	prepared := func(k ckptKey) stagedRank {
		if k == key {
			return &stagedAt{dir: dir}
		}
		return nil
	}
	var d donors
	log := slog.New(slog.DiscardHandler)
	if _, err := d.get(key, "n4", prepared, log); err != nil {
		t.Fatal(err)
	}
	if err := d.donate(key, prepared, log); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(dir) // the prepare is aborted, its staging dir removed
	dn, err := d.get(key, "n4", prepared, log)
	if err != nil {
		t.Fatal(err)
	}
	forbidden := func(err error) bool {
		var we *agentv1.Error
		return errors.As(err, &we) && we.Code == agentv1.CodeForbidden
	}
	if _, err := d.get(key, "n5", prepared, log); !forbidden(err) {
		t.Errorf("another agent's read = %v, want forbidden", err)
	}
	if ok, err := d.drop(key, "n5"); ok || !forbidden(err) {
		t.Errorf("another agent's drop = %v, %v, want forbidden", ok, err)
	}
	if len(dn.files) != 1 || dn.files["pages-1.img"] == nil {
		t.Fatalf("the donor opened %v, want pages-1.img alone", dn.files)
	}
	b := make([]byte, lazy.PageSize)
	if _, err := dn.files["pages-1.img"].ReadAt(b, 2*lazy.PageSize); err != nil || b[0] != 3 {
		t.Fatalf("page 2 after the staging dir went: %v, %d", err, b[0])
	}
	if !d.isDonated(key) {
		t.Fatal("a donated donor is not marked so")
	}
	if ok, err := d.drop(key, "n4"); !ok || err != nil {
		t.Fatalf("the reader's drop = %v, %v", ok, err)
	}
	if ok, _ := d.drop(key, "n4"); ok {
		t.Fatal("a donor dropped twice")
	}
	var we *agentv1.Error
	if _, err := d.get(ckptKey{"j.1", 5}, "n4", prepared, log); !errors.As(err, &we) || we.Code != agentv1.CodeNotFound {
		t.Fatalf("a donor of an image not prepared here = %v, want not found", err)
	}
}

// TestRunsOf: pages asked for become runs of consecutive pages, in order.
func TestRunsOf(t *testing.T) {
	got := runsOf([]int64{3, 4, 5, 9, 10, 2, 2})
	want := [][2]int64{{3, 3}, {9, 2}, {2, 1}, {2, 1}}
	if !slices.Equal(got, want) {
		t.Fatalf("runsOf = %v, want %v", got, want)
	}
}
