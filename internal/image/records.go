package image

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/cairn-hpc/cairn/internal/durable"
	"github.com/cairn-hpc/cairn/internal/names"
)

func (r Repo) containerDir(container string) string { return filepath.Join(r.Dir, container) }

// checkRef refuses a container name or checkpoint number that cannot be
// one of the catalog's (names.ErrInvalid) before it becomes a path.
func checkRef(container string, seq int) error {
	if err := names.Container(container); err != nil {
		return err
	}
	return names.Seq(seq)
}

func (r Repo) recordPath(container string, seq int) string {
	return filepath.Join(r.containerDir(container), strconv.Itoa(seq)+".json")
}

// List returns a container's records, oldest first. A record that does not
// parse is reported in the error slice and left out.
func (r Repo) List(container string) ([]*Record, []error) {
	if err := names.Container(container); err != nil {
		return nil, []error{err}
	}
	ents, err := os.ReadDir(r.containerDir(container))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, []error{err}
	}
	var recs []*Record
	var errs []error
	for _, e := range ents {
		seq, ok := seqOf(e.Name())
		if !ok {
			continue
		}
		rec, err := r.Load(container, seq)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		recs = append(recs, rec)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Seq < recs[j].Seq })
	return recs, errs
}

func seqOf(name string) (int, bool) {
	s, ok := strings.CutSuffix(name, ".json")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n > 0
}

// All returns the records of every container, by container then seq.
func (r Repo) All() ([]*Record, []error) {
	names, err := r.Containers()
	if err != nil {
		return nil, []error{err}
	}
	var all []*Record
	var errs []error
	for _, n := range names {
		recs, e := r.List(n)
		all, errs = append(all, recs...), append(errs, e...)
	}
	return all, errs
}

// Containers lists the containers that have images.
func (r Repo) Containers() ([]string, error) {
	ents, err := os.ReadDir(r.Dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// Latest returns the newest record of a container.
func (r Repo) Latest(container string) (*Record, error) {
	if err := names.Container(container); err != nil {
		return nil, err
	}
	recs, _ := r.List(container)
	if len(recs) == 0 {
		return nil, fmt.Errorf("%w: container %s has no checkpoint", ErrNotFound, container)
	}
	return recs[len(recs)-1], nil
}

// NextSeq returns the number the next image of container gets.
func (r Repo) NextSeq(container string) int {
	ents, _ := os.ReadDir(r.containerDir(container))
	next := 1
	for _, e := range ents {
		name := e.Name()
		if i := strings.IndexByte(name, '.'); i >= 0 {
			name = name[:i]
		}
		if n, err := strconv.Atoi(name); err == nil && n >= next {
			next = n + 1
		}
	}
	return next
}

// Load reads one record.
func (r Repo) Load(container string, seq int) (*Record, error) {
	if err := checkRef(container, seq); err != nil {
		return nil, err
	}
	name := fmt.Sprintf("%s:%d", container, seq)
	b, err := os.ReadFile(r.recordPath(container, seq))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		return nil, err
	}
	var rec Record
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return nil, &CorruptError{Image: name, What: "record", Reason: err.Error()}
	}
	if rec.Version != RecordVersion || rec.Container != container || rec.Seq != seq || rec.Manifest.IsNull() {
		return nil, &CorruptError{Image: name, What: "record", Reason: fmt.Sprintf("version %d, names %s, manifest %s", rec.Version, rec.Name(), rec.Manifest.Short())}
	}
	return &rec, nil
}

func (r Repo) saveRecord(rec *Record) error {
	if err := checkRef(rec.Container, rec.Seq); err != nil {
		return err
	}
	rec.Version = RecordVersion
	if err := os.MkdirAll(r.containerDir(rec.Container), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return durable.WriteFile(r.recordPath(rec.Container, rec.Seq), b, 0o600)
}

// SetPinned pins (or unpins) a checkpoint: gc keeps pinned checkpoints
// whatever the retention policy.
func (r Repo) SetPinned(container string, seq int, pinned bool) error {
	rec, err := r.Load(container, seq)
	if err != nil {
		return err
	}
	rec.Pinned = pinned
	return r.saveRecord(rec)
}

// Remove deletes a checkpoint's record. Its data stays in the store until
// gc finds no other checkpoint uses it.
func (r Repo) Remove(container string, seq int) error {
	if err := checkRef(container, seq); err != nil {
		return err
	}
	if _, err := os.Stat(r.recordPath(container, seq)); err != nil {
		return fmt.Errorf("%w: %s:%d", ErrNotFound, container, seq)
	}
	if err := os.Remove(r.recordPath(container, seq)); err != nil {
		return err
	}
	_ = os.Remove(r.containerDir(container)) // only if empty
	return durable.SyncDir(r.Dir)
}

// CleanTemp removes records an interrupted write left half-written.
func (r Repo) CleanTemp(container string) {
	if names.Container(container) != nil {
		return
	}
	ents, _ := os.ReadDir(r.containerDir(container))
	for _, e := range ents {
		if isTempRecord(e.Name()) {
			_ = os.RemoveAll(filepath.Join(r.containerDir(container), e.Name()))
		}
	}
}
