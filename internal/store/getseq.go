package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"runtime"

	"github.com/cairn-hpc/cairn/internal/store/index"
)

// maxRunBytes bounds how much of a pack GetSeq reads at once.
const maxRunBytes = 4 << 20

// GetSeq reads the chunks ids in order and calls fn with each one's bytes,
// verified against its id as Get does; data is valid only during the call,
// and fn runs on the caller's goroutine. Chunks that lie next to each other
// in a pack (as the chunks of one file ingested together do) are read with
// one read of up to 4 MiB, and decoded and verified on every core: a restore
// reads each pack region once instead of once per 4 KiB page. Errors are
// those of Get; fn's error stops GetSeq and is returned.
func (s *Store) GetSeq(ctx context.Context, ids []ID, fn func(data []byte) error) error {
	type run struct {
		pack ID
		off  uint64
		locs []index.Location
		ids  []ID
		get  bool // read with Get: pending, unknown, or pack gone
	}
	var runs []*run
	for _, id := range ids {
		loc, ok := s.idx.Lookup(id)
		if !ok {
			runs = append(runs, &run{ids: []ID{id}, get: true})
			continue
		}
		if n := len(runs); n > 0 && !runs[n-1].get && runs[n-1].pack == loc.Pack {
			r := runs[n-1]
			if r.locs[len(r.locs)-1].End() == loc.Offset && loc.End()-r.off <= maxRunBytes {
				r.locs, r.ids = append(r.locs, loc), append(r.ids, id)
				continue
			}
		}
		runs = append(runs, &run{pack: loc.Pack, off: loc.Offset, locs: []index.Location{loc}, ids: []ID{id}})
	}

	type result struct {
		chunks [][]byte
		err    error
	}
	read := func(r *run) result {
		if !r.get {
			chunks, err := s.readRun(r.pack, r.off, r.locs)
			if !errors.Is(err, fs.ErrNotExist) {
				return result{chunks, err}
			}
			// GC moved the chunks: Get finds them again.
		}
		chunks := make([][]byte, 0, len(r.ids))
		for _, id := range r.ids {
			data, err := s.Get(ctx, id)
			if err != nil {
				return result{err: err}
			}
			chunks = append(chunks, data)
		}
		return result{chunks: chunks}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type job struct {
		r *run
		f chan result
	}
	workers := runtime.NumCPU()
	jobs := make(chan job, 2*workers)
	queue := make(chan chan result, 2*workers)
	for range workers {
		go func() {
			for j := range jobs {
				if ctx.Err() != nil {
					j.f <- result{err: ctx.Err()}
					continue
				}
				j.f <- read(j.r)
			}
		}()
	}
	go func() {
		defer close(queue)
		defer close(jobs)
		for _, r := range runs {
			f := make(chan result, 1)
			select {
			case queue <- f:
			case <-ctx.Done():
				return
			}
			jobs <- job{r, f}
		}
	}()
	var first error
	for f := range queue {
		res := <-f
		if first != nil {
			continue // drain
		}
		if res.err != nil {
			first = res.err
			cancel()
			continue
		}
		for _, c := range res.chunks {
			if err := fn(c); err != nil {
				first = err
				cancel()
				break
			}
		}
	}
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// readRun reads the contiguous blobs locs of a pack, starting at off, with
// one read, and returns their verified chunks.
func (s *Store) readRun(packID ID, off uint64, locs []index.Location) ([][]byte, error) {
	f, release, err := s.openPackFile(packID)
	if err != nil {
		return nil, err
	}
	defer release()
	end := locs[len(locs)-1].End()
	buf := make([]byte, end-off)
	if n, err := f.ReadAt(buf, int64(off)); n != len(buf) {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		loc := locs[0]
		return nil, &CorruptError{ID: loc.ID, Pack: packID, Offset: loc.Offset, Err: fmt.Errorf("read %d bytes at %d: %w", len(buf), off, err)}
	}
	chunks := make([][]byte, len(locs))
	for i, loc := range locs {
		blob := buf[loc.Offset-off : loc.End()-off]
		data, err := s.codec.decompress(blob, loc.RawLength, loc.Compression)
		if err == nil {
			if got := Hash(data); got != ID(loc.ID) {
				err = fmt.Errorf("content hashes to %s", got)
			}
		}
		if err != nil {
			return nil, &CorruptError{ID: loc.ID, Pack: packID, Offset: loc.Offset, Err: err}
		}
		chunks[i] = data
	}
	return chunks, nil
}
