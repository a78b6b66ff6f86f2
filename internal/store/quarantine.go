package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cairn-hpc/cairn/internal/store/index"
	"github.com/cairn-hpc/cairn/internal/store/pack"
)

// quarantineDir holds the damaged packs a writer's recovery set aside,
// each with a report; see docs/format.md.
const quarantineDir = "quarantine"

// Quarantine describes a damaged pack that a writer's recovery moved to
// quarantine/ instead of deleting it.
type Quarantine struct {
	// Pack is the pack's name: the ID it should hash to.
	Pack ID `json:"pack"`
	// File is the quarantined file's name in quarantine/ (the pack's ID,
	// with a suffix if a pack of that name was quarantined before).
	File string `json:"file"`
	// Time is when the pack was quarantined.
	Time time.Time `json:"time"`
	// Reason says what was wrong with the pack.
	Reason string `json:"reason"`
	// Salvaged counts the blobs that still verified: their chunks are
	// stored again (or were already stored elsewhere) and stay readable.
	Salvaged int `json:"salvaged"`
	// Lost counts the blobs that did not verify; -1 when not even the
	// pack's trailer could be read, so that how many blobs it held is
	// unknown.
	Lost int `json:"lost"`
}

// String describes q in one line.
func (q Quarantine) String() string {
	lost := strconv.Itoa(q.Lost)
	if q.Lost < 0 {
		lost = "an unknown number"
	}
	return fmt.Sprintf("pack %s quarantined as %s: %d blobs salvaged, %s lost (%s)",
		q.Pack, filepath.Join(quarantineDir, q.File), q.Salvaged, lost, q.Reason)
}

// QuarantineError reports damaged packs that a writer's recovery
// quarantined. It matches ErrCorrupt with errors.Is. The store is usable:
// every chunk of a quarantined pack that verified is readable.
type QuarantineError struct {
	Dir   string // the store's directory
	Packs []Quarantine
}

func (e *QuarantineError) Error() string {
	parts := make([]string, len(e.Packs))
	for i, q := range e.Packs {
		parts[i] = q.String()
	}
	return fmt.Sprintf("store %s: damaged %s", e.Dir, strings.Join(parts, "; "))
}

// Is reports whether target is ErrCorrupt.
func (e *QuarantineError) Is(target error) bool { return target == ErrCorrupt }

// QuarantineErr returns a *QuarantineError naming the packs that this
// store's Open quarantined, or nil if it quarantined none.
func (s *Store) QuarantineErr() error {
	if len(s.quarantined) == 0 {
		return nil
	}
	return &QuarantineError{Dir: s.dir, Packs: append([]Quarantine(nil), s.quarantined...)}
}

// Quarantined returns the reports of every pack in quarantine/, ordered
// by file name. A quarantined file whose report is missing or unreadable
// is listed with what its name says.
func (s *Store) Quarantined() ([]Quarantine, error) { return Quarantined(s.dir) }

// Quarantined is Store.Quarantined for the store in dir, without opening
// it: a store that does not exist has none.
func Quarantined(dir string) ([]Quarantine, error) {
	qdir := filepath.Join(dir, quarantineDir)
	ents, err := os.ReadDir(qdir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list quarantine: %w", err)
	}
	var out []Quarantine
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, ".json") {
			continue
		}
		id, err := ParseID(strings.SplitN(name, ".", 2)[0])
		if err != nil {
			continue // not ours
		}
		q := Quarantine{Pack: id, File: name, Lost: -1, Reason: "no report"}
		b, err := os.ReadFile(filepath.Join(qdir, name+".json"))
		if err == nil {
			var r Quarantine
			if err := json.Unmarshal(b, &r); err == nil && r.Pack == id {
				q = r
				q.File = name
			}
		}
		if q.Time.IsZero() {
			if fi, err := e.Info(); err == nil {
				q.Time = fi.ModTime()
			}
		}
		out = append(out, q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].File < out[j].File })
	return out, nil
}

// damagedPack is an unindexed pack that recovery found damaged.
type damagedPack struct {
	id     ID
	path   string
	reason error
}

// salvage stores again every chunk of the damaged packs whose blob still
// verifies, makes them durable together with the packs recovered so far,
// and then moves each damaged pack to quarantine/ with its report. It
// removes nothing. The caller is a writer's recovery.
func (s *Store) salvage(packs []damagedPack) error {
	reports := make([]Quarantine, len(packs))
	s.mu.Lock()
	for i, p := range packs {
		q := Quarantine{Pack: p.id, Time: time.Now().UTC(), Reason: p.reason.Error(), Lost: -1}
		data, _ := os.ReadFile(p.path) // nil if unreadable: nothing to salvage
		entries, total, ok := salvageEntries(data)
		if ok {
			q.Lost = total
		}
		for _, e := range entries {
			loc := index.Location{Pack: p.id, Entry: e}
			blob, _, err := s.load(bytes.NewReader(data), ID(e.ID), loc)
			if err != nil {
				continue
			}
			if _, err := s.addBlobLocked(ID(e.ID), blob, int(e.RawLength), e.Compression); err != nil {
				s.mu.Unlock()
				return fmt.Errorf("salvage pack %s: %w", p.id, err)
			}
			q.Salvaged++
			q.Lost--
		}
		reports[i] = q
	}
	err := s.flushLocked()
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("salvage: %w", err)
	}
	created, err := mkdir(s.path(quarantineDir))
	if err != nil {
		return fmt.Errorf("quarantine: %w", err)
	}
	if created {
		if err := syncDir(s.dir); err != nil {
			return fmt.Errorf("quarantine: %w", err)
		}
	}
	for i, p := range packs {
		q := &reports[i]
		if err := s.quarantine(p, q); err != nil {
			return err
		}
		s.log.Warn("damaged pack quarantined", "pack", p.id.String(), "file", q.File,
			"salvaged", q.Salvaged, "lost", q.Lost, "err", p.reason)
		s.quarantined = append(s.quarantined, *q)
	}
	return nil
}

// quarantine writes q's report and then moves pack p beside it. A crash in
// between leaves the pack where it was, to be salvaged again by the next
// writer, which reuses the name.
func (s *Store) quarantine(p damagedPack, q *Quarantine) error {
	q.File = p.id.String()
	for n := 1; ; n++ {
		if _, err := os.Lstat(s.path(quarantineDir, q.File)); errors.Is(err, fs.ErrNotExist) {
			break
		}
		q.File = p.id.String() + "." + strconv.Itoa(n)
	}
	b, err := json.MarshalIndent(q, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(s.path(tmpDir), s.path(quarantineDir, q.File+".json"), append(b, '\n')); err != nil {
		return fmt.Errorf("quarantine pack %s: %w", p.id, err)
	}
	if err := os.Rename(p.path, s.path(quarantineDir, q.File)); err != nil {
		return fmt.Errorf("quarantine pack %s: %w", p.id, err)
	}
	if err := syncDir(s.path(quarantineDir)); err != nil {
		return fmt.Errorf("quarantine pack %s: %w", p.id, err)
	}
	return syncDir(filepath.Dir(p.path))
}

// salvageEntries returns the entries of a damaged pack that may still
// describe intact blobs, and how many entries the pack has (ok false when
// that is unknown). With a valid header that is all of them; with a
// damaged one, every entry that decodes on its own and lies within the
// blob area, as long as the trailer still gives their number. Each blob
// is verified against its chunk ID before it is used, so a damaged entry
// can lose its blob but never let a wrong one in.
func salvageEntries(b []byte) (entries []pack.Entry, total int, ok bool) {
	if b == nil {
		return nil, 0, false
	}
	if es, err := pack.ReadHeader(bytes.NewReader(b), int64(len(b))); err == nil {
		return es, len(es), true
	}
	if len(b) < pack.HeaderOffset+pack.TrailerSize {
		return nil, 0, false
	}
	_, n, err := pack.ParseTrailer(b[len(b)-pack.TrailerSize:])
	if err != nil {
		return nil, 0, false
	}
	hdrLen := int64(n) * pack.EntrySize
	if hdrLen > int64(len(b)-pack.HeaderOffset-pack.TrailerSize) {
		return nil, 0, false
	}
	hdrStart := uint64(int64(len(b)-pack.TrailerSize) - hdrLen)
	hdr := b[hdrStart : len(b)-pack.TrailerSize]
	for i := 0; i < int(n); i++ {
		e, err := pack.ParseEntry(hdr[i*pack.EntrySize:])
		if err != nil || e.Offset < uint64(pack.HeaderOffset) || e.End() > hdrStart {
			continue
		}
		entries = append(entries, e)
	}
	return entries, int(n), true
}
