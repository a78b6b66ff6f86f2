package store_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/store"
)

func smallPackOptions(t *testing.T) store.Options {
	opts := store.TestOptions(t)
	opts.PackSize = 32 << 10
	return opts
}

func TestRemoveManifest(t *testing.T) {
	s := store.TestStore(t)
	ctx := context.Background()
	files := map[string][]byte{"a": randBytes(1, 10000)}
	id := mustPutFiles(t, s, files)
	if err := s.RemoveManifest(ctx, id); err != nil {
		t.Fatalf("RemoveManifest: %v", err)
	}
	if _, err := s.LoadManifest(ctx, id); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("LoadManifest after remove = %v, want ErrNotFound", err)
	}
	if err := s.RemoveManifest(ctx, id); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("second RemoveManifest = %v, want ErrNotFound", err)
	}
	if !s.Has(store.Hash(files["a"][:testChunkSize])) {
		t.Error("chunks gone before GC")
	}
}

func TestGC(t *testing.T) {
	dir := t.TempDir()
	s, err := store.Open(dir, smallPackOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	var pool [][]byte
	var ids []store.ID
	var contents []map[string][]byte
	for range 6 {
		f := genFiles(rng, &pool)
		ids = append(ids, mustPutFiles(t, s, f))
		contents = append(contents, f)
	}
	before := s.Stats()
	keep := []store.ID{ids[1], ids[4]}
	var calls int
	st, err := s.GC(ctx, keep, store.GCOptions{Progress: func(done, total int64) {
		calls++
		if done != int64(calls) || done > total {
			t.Errorf("Progress(%d, %d) on call %d", done, total, calls)
		}
	}})
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	after := s.Stats()
	live := chunksOf(t, s, keep...)
	if after.Chunks != len(live) {
		t.Errorf("%d chunks after GC, want the %d of the kept manifests", after.Chunks, len(live))
	}
	if st.ManifestsRemoved != 4 || st.ChunksRemoved != before.Chunks-after.Chunks || st.PacksDeleted == 0 ||
		st.BytesAfter >= st.BytesBefore || calls != st.PacksDeleted {
		t.Errorf("GCStats = %+v (before %+v, after %+v, %d progress calls)", st, before, after, calls)
	}
	got, err := s.Manifests(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.ID{ids[1], ids[4]}
	if cmpID(want[0], want[1]) > 0 {
		want[0], want[1] = want[1], want[0]
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("manifests after GC (-want +got):\n%s", diff)
	}
	mustReadFiles(t, s, ids[1], contents[1])
	mustReadFiles(t, s, ids[4], contents[4])
	if idx := files(t, dir, "index"); len(idx) != 1 {
		t.Errorf("index files after GC: %v", idx)
	}
	if n := len(files(t, dir, "packs")); n != after.Packs {
		t.Errorf("%d pack files, index has %d packs", n, after.Packs)
	}

	// A second GC with the same keep has nothing to do.
	st, err = s.GC(ctx, keep, store.GCOptions{})
	if err != nil || st.PacksDeleted != 0 || st.ManifestsRemoved != 0 || st.BytesAfter != st.BytesBefore {
		t.Errorf("second GC = %+v, %v; want nothing done", st, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, dir)
	mustReadFiles(t, s, ids[1], contents[1])
	mustReadFiles(t, s, ids[4], contents[4])
	if got := s.Stats(); got != after {
		t.Errorf("Stats after reopen = %+v, want %+v", got, after)
	}
	r, err := s.Check(ctx, store.CheckOptions{ReadData: true})
	if err != nil || !r.OK() {
		t.Errorf("Check after GC = %+v, %v", r, err)
	}
}

func cmpID(a, b store.ID) int {
	for i := range a {
		if a[i] != b[i] {
			return int(a[i]) - int(b[i])
		}
	}
	return 0
}

func TestGCRefuses(t *testing.T) {
	s := store.TestStore(t)
	ctx := context.Background()
	id := mustPutFiles(t, s, map[string][]byte{"a": randBytes(1, 10000)})
	other := mustPutFiles(t, s, map[string][]byte{"b": randBytes(2, 10000)})
	_, err := s.GC(ctx, []store.ID{id, store.Hash([]byte("no such manifest"))}, store.GCOptions{})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GC keeping a missing manifest = %v, want ErrNotFound", err)
	}
	if _, err := s.LoadManifest(ctx, other); err != nil {
		t.Errorf("failed GC removed a manifest: %v", err)
	}

	ropts := store.TestOptions(t)
	ropts.ReadOnly = true
	r, err := store.Open(s.Dir(), ropts)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.GC(ctx, nil, store.GCOptions{}); !errors.Is(err, store.ErrReadOnly) {
		t.Errorf("reader GC = %v, want ErrReadOnly", err)
	}
	if err := r.RemoveManifest(ctx, id); !errors.Is(err, store.ErrReadOnly) {
		t.Errorf("reader RemoveManifest = %v, want ErrReadOnly", err)
	}
}

func TestGCThreshold(t *testing.T) {
	s, err := store.Open(t.TempDir(), smallPackOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	// One pack: 7 live chunks and 1 dead one.
	big := map[string][]byte{"a": randBytes(1, 7*testChunkSize)}
	keep := mustPutFiles(t, s, big)
	mustPutFiles(t, s, map[string][]byte{"b": randBytes(2, testChunkSize)})
	if got := s.Stats(); got.Packs != 2 {
		t.Fatalf("Stats = %+v, want the chunks in 2 packs", got)
	}
	st, err := s.GC(ctx, []store.ID{keep}, store.GCOptions{RepackThreshold: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	if st.PacksRewritten != 0 || st.PacksDeleted != 1 {
		t.Errorf("GC with threshold = %+v; want only the all-dead pack deleted", st)
	}
	mustReadFiles(t, s, keep, big)
}

// TestGCReadSession checks that GC waits for a reader's session before it
// deletes packs, and that a reader whose index is stale finds moved chunks.
func TestGCReadSession(t *testing.T) {
	dir := t.TempDir()
	s, err := store.Open(dir, smallPackOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	var pool [][]byte
	var ids []store.ID
	var contents []map[string][]byte
	for range 4 {
		f := genFiles(rng, &pool)
		ids = append(ids, mustPutFiles(t, s, f))
		contents = append(contents, f)
	}
	ropts := store.TestOptions(t)
	ropts.ReadOnly = true
	r, err := store.Open(dir, ropts)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	release, err := r.ReadSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() {
		_, err := s.GC(ctx, ids[2:], store.GCOptions{})
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("GC finished (%v) during a read session", err)
	case <-time.After(200 * time.Millisecond):
	}
	// Meanwhile the reader reads, from the old packs.
	mustReadFiles(t, r, ids[3], contents[3])
	release()
	release() // idempotent
	if err := <-done; err != nil {
		t.Fatalf("GC: %v", err)
	}
	// The old packs are gone; the reader reloads the index and reads on.
	mustReadFiles(t, r, ids[2], contents[2])
	mustReadFiles(t, r, ids[3], contents[3])
	if _, err := r.LoadManifest(ctx, ids[0]); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("removed manifest: LoadManifest = %v", err)
	}

	// A GC that cannot get the readers lock gives up when ctx is done and
	// leaves a consistent store.
	release, err = r.ReadSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := s.GC(tctx, ids[3:], store.GCOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("GC during a session with a deadline = %v, want DeadlineExceeded", err)
	}
	release()
	mustReadFiles(t, s, ids[3], contents[3])
	mustReadFiles(t, r, ids[3], contents[3])
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, dir)
	mustReadFiles(t, s, ids[3], contents[3])
	if _, err := s.GC(ctx, ids[3:], store.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, want := s.Stats().Chunks, len(chunksOf(t, s, ids[3])); got != want {
		t.Errorf("%d chunks after finishing the GC, want %d", got, want)
	}
}

// TestGCConcurrentGet reads kept manifests on the writer while GC moves
// their chunks.
func TestGCConcurrentGet(t *testing.T) {
	s, err := store.Open(t.TempDir(), smallPackOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 6))
	var pool [][]byte
	var ids []store.ID
	var contents []map[string][]byte
	for range 8 {
		f := genFiles(rng, &pool)
		ids = append(ids, mustPutFiles(t, s, f))
		contents = append(contents, f)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := 6 + w
				got, err := readFiles(ctx, s, ids[i])
				if err != nil {
					t.Errorf("read during GC: %v", err)
					return
				}
				if !cmp.Equal(got, contents[i]) {
					t.Error("read during GC: files differ")
					return
				}
			}
		}()
	}
	for i := range 4 {
		keep := ids[2+i:]
		if _, err := s.GC(ctx, keep, store.GCOptions{}); err != nil {
			t.Error(err)
		}
	}
	close(stop)
	wg.Wait()
}
