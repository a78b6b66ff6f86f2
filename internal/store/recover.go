package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cairn-hpc/cairn/internal/store/index"
	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// FormatVersion is the store layout version recorded in the config file.
const FormatVersion = 1

type config struct {
	Version int `json:"version"`
}

// initDir checks the store directory, creating it for a writer, and takes
// the writer's lock.
func (s *Store) initDir() error {
	if s.opts.ReadOnly {
		return s.readConfig()
	}
	if err := os.MkdirAll(s.dir, dirMode); err != nil {
		return err
	}
	var err error
	if s.lockFd, err = lockDir(s.dir); err != nil {
		return err
	}
	f, err := openReaders(s.dir) // create it for readers that cannot
	if err != nil {
		return err
	}
	_ = f.Close()
	for _, d := range []string{packsDir, indexDir, manifestsDir, tmpDir} {
		if _, err := mkdir(s.path(d)); err != nil {
			return err
		}
	}
	err = s.readConfig()
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	b, _ := json.Marshal(config{Version: FormatVersion})
	if err := writeFileAtomic(s.path(tmpDir), s.path(configFile), append(b, '\n')); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	return syncDir(filepath.Dir(s.dir))
}

func (s *Store) readConfig() error {
	b, err := os.ReadFile(s.path(configFile))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read config: %w: %w", ErrNotMade, err)
	}
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	var c config
	if err := json.Unmarshal(b, &c); err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	if c.Version != FormatVersion {
		return fmt.Errorf("store format version %d, want %d", c.Version, FormatVersion)
	}
	return nil
}

// recover loads the index files, then indexes the packs that none of them
// lists. A writer also cleans up after a crash: it empties tmp/, sets aside
// damaged index files, quarantines unlisted packs that are damaged (after
// storing again every blob of them that still verifies) and writes an
// index file for the packs it recovered. Nothing outside tmp/ is removed.
func (s *Store) recover() error {
	if !s.opts.ReadOnly {
		if err := s.cleanTmp(); err != nil {
			return err
		}
	}
	if err := s.loadIndexFiles(); err != nil {
		return err
	}
	damaged, err := s.indexUnlistedPacks()
	if err != nil {
		return err
	}
	if len(damaged) > 0 {
		return s.salvage(damaged)
	}
	if s.opts.ReadOnly || len(s.unsaved) == 0 {
		return nil
	}
	if err := s.writeIndex(s.unsaved); err != nil {
		return err
	}
	s.unsaved = nil
	return nil
}

func (s *Store) cleanTmp() error {
	entries, err := os.ReadDir(s.path(tmpDir))
	if err != nil {
		return err
	}
	for _, e := range entries {
		s.log.Warn("removing file left by an interrupted write", "file", e.Name())
		if err := os.RemoveAll(s.path(tmpDir, e.Name())); err != nil {
			return fmt.Errorf("clean tmp: %w", err)
		}
	}
	return nil
}

func (s *Store) loadIndexFiles() error {
	entries, err := os.ReadDir(s.path(indexDir))
	if err != nil {
		return err
	}
	for _, e := range entries {
		id, err := ParseID(e.Name())
		if err != nil {
			continue // a set-aside ".corrupt" file, or not ours
		}
		packs, err := s.readIndexFile(id)
		if err != nil {
			// The packs it lists are found again by their headers.
			s.log.Warn("ignoring damaged index file", "index", id.String(), "err", err)
			if !s.opts.ReadOnly {
				if err := os.Rename(s.indexPath(id), s.indexPath(id)+".corrupt"); err != nil {
					return fmt.Errorf("set aside index %s: %w", id, err)
				}
			}
			continue
		}
		for _, p := range packs {
			s.idx.AddPack(p.Pack, p.Entries)
		}
	}
	return nil
}

func (s *Store) readIndexFile(id ID) ([]index.PackEntries, error) {
	b, err := os.ReadFile(s.indexPath(id))
	if err != nil {
		return nil, err
	}
	if got := Hash(b); got != id {
		return nil, fmt.Errorf("content hashes to %s", got)
	}
	return index.Decode(b)
}

// indexUnlistedPacks reads every pack that no index file lists (the packs
// finished after the last index file was written) and indexes those that
// hash to their names and have a valid header. A writer gets back the
// others, to salvage and quarantine; a reader ignores them.
func (s *Store) indexUnlistedPacks() ([]damagedPack, error) {
	var damaged []damagedPack
	err := s.walkPacks(func(id ID, path string) error {
		if s.idx.HasPack(id) {
			return nil
		}
		b, err := os.ReadFile(path)
		var entries []pack.Entry
		if err == nil {
			entries, err = checkPack(b, id)
		}
		if err != nil {
			if s.opts.ReadOnly {
				s.log.Warn("ignoring damaged unindexed pack", "pack", id.String(), "err", err)
				return nil
			}
			damaged = append(damaged, damagedPack{id: id, path: path, reason: err})
			return nil
		}
		s.log.Info("indexing pack missing from the index", "pack", id.String(), "chunks", len(entries))
		s.idx.AddPack(id, entries)
		s.unsaved = append(s.unsaved, index.PackEntries{Pack: id, Entries: entries})
		return nil
	})
	return damaged, err
}

// walkPacks calls fn for every file under packs/ named like a pack.
func (s *Store) walkPacks(fn func(id ID, path string) error) error {
	dirs, err := os.ReadDir(s.path(packsDir))
	if err != nil {
		return err
	}
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		files, err := os.ReadDir(s.path(packsDir, d.Name()))
		if err != nil {
			return err
		}
		for _, f := range files {
			id, err := ParseID(f.Name())
			if err != nil || id.String()[:2] != d.Name() {
				continue
			}
			if err := fn(id, s.path(packsDir, d.Name(), f.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkPack checks that the bytes b of a pack file hash to id and returns
// its entries.
func checkPack(b []byte, id ID) ([]pack.Entry, error) {
	if got := Hash(b); got != id {
		return nil, fmt.Errorf("content hashes to %s", got)
	}
	return pack.ReadHeader(bytes.NewReader(b), int64(len(b)))
}

// RebuildIndex replaces every index file by one built from the headers of
// all packs, the way to repair a store whose index files are lost or
// damaged. If a pack's header cannot be read, RebuildIndex returns an error
// naming it and leaves the index files as they were.
func (s *Store) RebuildIndex(ctx context.Context) error {
	if s.opts.ReadOnly {
		return fmt.Errorf("rebuild index: %w", ErrReadOnly)
	}
	s.gcLock.Lock()
	defer s.gcLock.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("rebuild index: %w", ErrClosed)
	}
	if err := s.flushLocked(); err != nil {
		return fmt.Errorf("rebuild index: %w", err)
	}
	old, err := os.ReadDir(s.path(indexDir))
	if err != nil {
		return fmt.Errorf("rebuild index: %w", err)
	}
	var packs []index.PackEntries
	var errs []error
	err = s.walkPacks(func(id ID, path string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		entries, err := readHeader(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("pack %s: %w", id, err))
			return nil
		}
		packs = append(packs, index.PackEntries{Pack: id, Entries: entries})
		return nil
	})
	if err = errors.Join(append([]error{err}, errs...)...); err != nil {
		return fmt.Errorf("rebuild index: %w", err)
	}
	for _, p := range packs {
		s.idx.AddPack(p.Pack, p.Entries)
	}
	b := index.Encode(packs)
	newID := Hash(b)
	if err := writeFileAtomic(s.path(tmpDir), s.indexPath(newID), b); err != nil {
		return fmt.Errorf("rebuild index: write index %s: %w", newID, err)
	}
	for _, e := range old {
		if e.Name() == newID.String() {
			continue
		}
		if err := os.Remove(s.path(indexDir, e.Name())); err != nil {
			return fmt.Errorf("rebuild index: %w", err)
		}
	}
	if err := syncDir(s.path(indexDir)); err != nil {
		return fmt.Errorf("rebuild index: %w", err)
	}
	return nil
}

// readHeader returns the entries of the pack file at path, reading only its
// tail.
func readHeader(path string) ([]pack.Entry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return pack.ReadHeader(f, fi.Size())
}
