package lazy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// PageSize is the page size of the images this package serves (x86_64).
const PageSize = 4096

// Pagemap entry flags (criu/include/pagemap.h).
const (
	FlagParent  = 1 << 0 // the pages are in the parent image
	FlagLazy    = 1 << 1 // the restore may leave the pages to the daemon
	FlagPresent = 1 << 2 // the pages are in the pages file
)

// Magic numbers of a pagemap image (criu/include/magic.h).
const (
	imgCommonMagic = 0x54564319
	pagemapMagic   = 0x56084025
)

// ErrBadImage is matched by the errors of a pagemap image that does not
// parse.
var ErrBadImage = errors.New("bad pagemap image")

// Entry is one range of a process's memory in its image.
type Entry struct {
	Vaddr   uint64 // at dump time
	NrPages uint64
	Flags   uint32
	// Off is where the range's pages start in the pages file, for an
	// entry with FlagPresent.
	Off int64
}

// End is the first address past the entry.
func (e Entry) End() uint64 { return e.Vaddr + e.NrPages*PageSize }

// Lazy tells whether the daemon asks the page server for the entry's
// pages: they are in the pages file and the restore leaves them out.
func (e Entry) Lazy() bool { return e.Flags&FlagLazy != 0 && e.Flags&FlagPresent != 0 }

// Pagemap is the pagemap image of one process.
type Pagemap struct {
	PID     int    // the process's pid in the image
	PagesID uint32 // its pages are in pages-<PagesID>.img
	Entries []Entry
}

// PagesFile names the process's pages file.
func (p *Pagemap) PagesFile() string { return fmt.Sprintf("pages-%d.img", p.PagesID) }

// Find returns the entry holding addr, if any.
func (p *Pagemap) Find(addr uint64) (Entry, bool) {
	i := sort.Search(len(p.Entries), func(i int) bool { return p.Entries[i].End() > addr })
	if i < len(p.Entries) && p.Entries[i].Vaddr <= addr {
		return p.Entries[i], true
	}
	return Entry{}, false
}

// ParsePagemap decodes a pagemap image (pagemap-<pid>.img): two magic
// numbers, then protobuf messages each after its u32 length, the first a
// pagemap_head {pages_id = 1}, the others pagemap_entry {vaddr = 1,
// nr_pages = 2 (before CRIU 4.2), in_parent = 3, flags = 4, nr_pages = 5}.
func ParsePagemap(b []byte, pid int) (*Pagemap, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: pagemap-%d.img: %s", ErrBadImage, pid, fmt.Sprintf(format, args...))
	}
	if len(b) < 8 || binary.LittleEndian.Uint32(b) != imgCommonMagic || binary.LittleEndian.Uint32(b[4:]) != pagemapMagic {
		return nil, bad("magic")
	}
	b = b[8:]
	if len(b) == 0 {
		return nil, bad("no head")
	}
	pm := &Pagemap{PID: pid}
	var off int64
	for first := true; len(b) > 0; first = false {
		if len(b) < 4 {
			return nil, bad("truncated")
		}
		n := int(binary.LittleEndian.Uint32(b))
		if n > len(b)-4 {
			return nil, bad("truncated")
		}
		msg := b[4 : 4+n]
		b = b[4+n:]
		if first {
			id, err := field(msg, 1)
			if err != nil {
				return nil, bad("head: %v", err)
			}
			pm.PagesID = uint32(id)
			continue
		}
		e, err := parseEntry(msg)
		if err != nil {
			return nil, bad("entry %d: %v", len(pm.Entries), err)
		}
		if e.Flags&FlagPresent != 0 {
			e.Off = off
			off += int64(e.NrPages) * PageSize
		}
		if k := len(pm.Entries); k > 0 && pm.Entries[k-1].End() > e.Vaddr {
			return nil, bad("entry %d at %#x overlaps the one before", k, e.Vaddr)
		}
		pm.Entries = append(pm.Entries, e)
	}
	return pm, nil
}

// parseEntry decodes one pagemap_entry and normalizes it as CRIU does
// (init_compat_pagemap_entry).
func parseEntry(msg []byte) (Entry, error) {
	var e Entry
	var compatPages, pages uint64
	var hasFlags, hasPages, inParent bool
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return e, protowire.ParseError(n)
		}
		msg = msg[n:]
		if typ != protowire.VarintType {
			n = protowire.ConsumeFieldValue(num, typ, msg)
			if n < 0 {
				return e, protowire.ParseError(n)
			}
			msg = msg[n:]
			continue
		}
		v, n := protowire.ConsumeVarint(msg)
		if n < 0 {
			return e, protowire.ParseError(n)
		}
		msg = msg[n:]
		switch num {
		case 1:
			e.Vaddr = v
		case 2:
			compatPages = v
		case 3:
			inParent = v != 0
		case 4:
			e.Flags, hasFlags = uint32(v), true
		case 5:
			pages, hasPages = v, true
		}
	}
	switch {
	case inParent:
		e.Flags |= FlagParent
	case !hasFlags:
		e.Flags = FlagPresent
	}
	e.NrPages = compatPages
	if hasPages {
		e.NrPages = pages
	}
	if e.Vaddr%PageSize != 0 || e.NrPages == 0 || e.NrPages > 1<<36 || e.Vaddr+e.NrPages*PageSize < e.Vaddr {
		return e, fmt.Errorf("range %#x + %d pages", e.Vaddr, e.NrPages)
	}
	return e, nil
}

// field returns varint field num of a protobuf message.
func field(msg []byte, want protowire.Number) (uint64, error) {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		msg = msg[n:]
		if num == want && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(msg)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			return v, nil
		}
		n = protowire.ConsumeFieldValue(num, typ, msg)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		msg = msg[n:]
	}
	return 0, fmt.Errorf("no field %d", want)
}

// LoadPagemaps reads every pagemap-<pid>.img of a CRIU image dir (not the
// shared memory ones, which are never lazy), by pid.
func LoadPagemaps(dir string) (map[int]*Pagemap, error) {
	names, err := filepath.Glob(filepath.Join(dir, "pagemap-*.img"))
	if err != nil {
		return nil, err
	}
	out := map[int]*Pagemap{}
	for _, name := range names {
		s := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(name), "pagemap-"), ".img")
		pid, err := strconv.Atoi(s)
		if err != nil {
			continue // pagemap-shmem-N.img
		}
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		if out[pid], err = ParsePagemap(b, pid); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Eager returns, by pages file, the page indexes of that file the restore
// itself reads: those of present entries that are not lazy. A lazy
// restore needs only these in its local pages files.
func Eager(pms map[int]*Pagemap) map[string][]int64 {
	out := map[string][]int64{}
	for _, pm := range pms {
		for _, e := range pm.Entries {
			if e.Flags&FlagPresent == 0 || e.Lazy() {
				continue
			}
			for i := range int64(e.NrPages) {
				out[pm.PagesFile()] = append(out[pm.PagesFile()], e.Off/PageSize+i)
			}
		}
	}
	return out
}
