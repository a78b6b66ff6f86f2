package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cairn-hpc/cairn/internal/chunker"
	"github.com/cairn-hpc/cairn/internal/store"
)

// ParamsFor picks the chunking of a file of an image: CRIU's page images
// hold whole 4 KiB pages, and a process that changes 10% of its pages
// changes them scattered; only page-sized chunks keep the other 90% (see
// docs/format.md). Everything else is cut by content.
func ParamsFor(path string) chunker.Params {
	base := path[strings.LastIndexByte(path, '/')+1:]
	if strings.HasPrefix(base, "pages-") && strings.HasSuffix(base, ".img") {
		return chunker.PageParams
	}
	return chunker.DefaultParams
}

// ingestStats counts what an ingest wrote.
type ingestStats struct {
	newChunks atomic.Int64
	newBytes  atomic.Int64
	bytes     atomic.Int64 // all bytes ingested, for progress
}

var bufPools sync.Map // chunk size -> *sync.Pool

func getBuf(n int) []byte {
	p, _ := bufPools.LoadOrStore(n, &sync.Pool{New: func() any { b := make([]byte, n); return &b }})
	return *(p.(*sync.Pool).Get().(*[]byte))
}

func putBuf(b []byte) {
	if p, ok := bufPools.Load(cap(b)); ok {
		b = b[:cap(b)]
		p.(*sync.Pool).Put(&b)
	}
}

// putStream cuts r into chunks and puts them into st, hashing and
// compressing on every core, and returns the chunk ids in order and the
// stream's length.
func putStream(ctx context.Context, st *store.Store, r io.Reader, p chunker.Params, stats *ingestStats) ([]store.ID, uint64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	type result struct {
		id     store.ID
		stored bool
		n      int
		err    error
	}
	type job struct {
		data []byte
		f    chan result
	}
	workers := runtime.NumCPU()
	queue := make(chan chan result, 16*workers)
	jobs := make(chan job, 16*workers)
	for range workers {
		go func() {
			for j := range jobs {
				id, stored, err := st.Put(ctx, j.data)
				n := len(j.data)
				putBuf(j.data)
				j.f <- result{id, stored, n, err}
			}
		}()
	}
	go func() {
		defer close(queue)
		defer close(jobs)
		c := chunker.New(r, p)
		for ctx.Err() == nil {
			buf := getBuf(p.Max)
			ch, err := c.Next(buf)
			if err == io.EOF {
				putBuf(buf)
				return
			}
			f := make(chan result, 1)
			queue <- f
			if err != nil {
				f <- result{err: err}
				return
			}
			jobs <- job{ch.Data, f}
		}
	}()
	var ids []store.ID
	var size uint64
	var first error
	for f := range queue {
		res := <-f
		if res.err != nil {
			if first == nil {
				first = res.err
				cancel(res.err)
			}
			continue
		}
		ids = append(ids, res.id)
		size += uint64(res.n)
		stats.bytes.Add(int64(res.n))
		if res.stored {
			stats.newChunks.Add(1)
			stats.newBytes.Add(int64(res.n))
		}
	}
	return ids, size, first
}

// writeChunks writes the chunks ids to w in order, each verified against
// its id (store.GetSeq reads neighbouring chunks together, on every core).
func writeChunks(ctx context.Context, st Chunks, ids []store.ID, w io.Writer, done *atomic.Int64) (int64, error) {
	var n int64
	err := st.GetSeq(ctx, ids, func(data []byte) error {
		k, err := w.Write(data)
		n += int64(k)
		if done != nil {
			done.Add(int64(k))
		}
		return err
	})
	return n, err
}

// ingestFile puts one regular file of the staging dir into st.
func ingestFile(ctx context.Context, st *store.Store, path, name string, stats *ingestStats) ([]store.ID, uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	ids, n, err := putStream(ctx, st, f, ParamsFor(name), stats)
	if err != nil {
		return nil, 0, fmt.Errorf("ingest %s: %w", name, err)
	}
	return ids, n, nil
}

// storeErr turns a store error into a CorruptError naming the image, or
// returns it unchanged.
func storeErr(image string, err error) error {
	var ce *store.CorruptError
	switch {
	case errors.As(err, &ce):
		return &CorruptError{Image: image, What: "chunk " + ce.ID.String(), Reason: ce.Err.Error(), Err: err}
	case errors.Is(err, store.ErrNotFound):
		return &CorruptError{Image: image, What: "chunk", Reason: err.Error(), Err: err}
	}
	return err
}
