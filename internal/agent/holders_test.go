package agent_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/store"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// holders starts agents n1 (which fetches), n2 and n3, and gives n2 and
// n3 the same checkpoint c:1 of mib MiB of random memory pages.
func holders(t *testing.T, mib int) (ca *pki.CA, addrs map[string]string, envs map[string]*testutil.Env) {
	t.Helper()
	ctx := context.Background()
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addrs, envs = map[string]string{}, map[string]*testutil.Env{}
	for _, n := range []string{"n1", "n2", "n3"} {
		addrs[n], envs[n] = startAgentAs(t, ca, n)
	}
	pages := make([]byte, mib<<20)
	rand.Read(pages)
	src := imageSource(t, pages)
	repo2 := envs["n2"].Manager.Repo()
	if err := repo2.Ingest(ctx, src, &image.Record{Container: "c", Seq: 1, Config: []byte(`{}`)}, nil); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := repo2.Export(ctx, "c", 1, &buf, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := envs["n3"].Manager.Repo().Receive(ctx, &buf, "c", 1, nil); err != nil {
		t.Fatal(err)
	}
	return ca, addrs, envs
}

// fetchOnN1 has n1 fetch c:1 from from, and from also at once.
func fetchOnN1(t *testing.T, ca *pki.CA, addrs map[string]string, from string, also ...string) (agentv1.Image, error) {
	t.Helper()
	c := rpc.NewAgentClient(addrs["n1"], "n1", issue(t, ca, "coord", pki.Coordinator))
	defer c.Close()
	req := agentv1.Fetch{Container: "c", Seq: 1, From: addrs[from], FromNode: from}
	for _, n := range also {
		req.Also = append(req.Also, agentv1.Holder{Addr: addrs[n], Node: n})
	}
	return c.Fetch(context.Background(), req)
}

// verified checks that n1 holds c:1, every chunk read back intact.
func verified(t *testing.T, env *testutil.Env) {
	t.Helper()
	if _, err := env.Manager.Repo().Verify(context.Background(), "c", 1, true, nil); err != nil {
		t.Fatalf("the fetched image does not verify: %v", err)
	}
}

func share(img agentv1.Image, node string) agentv1.HolderShare {
	for _, sh := range img.Holders {
		if sh.Node == node {
			return sh
		}
	}
	return agentv1.HolderShare{}
}

// TestFetchFromHolders: an image held by two nodes is fetched from both
// at once, each sending part of it.
func TestFetchFromHolders(t *testing.T) {
	ca, addrs, envs := holders(t, 32)
	img, err := fetchOnN1(t, ca, addrs, "n2", "n3")
	if err != nil {
		t.Fatal(err)
	}
	verified(t, envs["n1"])
	for _, n := range []string{"n2", "n3"} {
		if sh := share(img, n); sh.Chunks == 0 || sh.Error != "" || sh.Damaged {
			t.Errorf("holder %s: %+v, want a share of the chunks and no error", n, sh)
		}
	}
	ids, err := envs["n2"].Manager.Repo().ChunkIDs(context.Background(), "c", 1)
	if err != nil {
		t.Fatal(err)
	}
	if sum := share(img, "n2").Chunks + share(img, "n3").Chunks; sum != len(ids) {
		t.Errorf("holders sent %d chunks in all, want %d (each once)", sum, len(ids))
	}
	t.Logf("shares: %+v", img.Holders)
}

// TestFetchHolderServesDamage: a holder whose copy is damaged says so at
// the first damaged chunk; its share comes from the other holder, the
// image fetched is intact, and the reply names the damaged holder (the
// coordinator then repairs it).
func TestFetchHolderServesDamage(t *testing.T) {
	ca, addrs, envs := holders(t, 16)
	damagePacks(t, envs["n3"].Manager.Repo().StoreDir)
	// n3 first, so that it is asked for the head and a share before n2
	// takes the rest.
	img, err := fetchOnN1(t, ca, addrs, "n3", "n2")
	if err != nil {
		t.Fatal(err)
	}
	verified(t, envs["n1"])
	if sh := share(img, "n3"); !sh.Damaged || sh.Error == "" {
		t.Errorf("damaged holder n3: %+v, want it named damaged", sh)
	}
	if sh := share(img, "n2"); sh.Damaged || sh.Error != "" || sh.Chunks == 0 {
		t.Errorf("intact holder n2: %+v", sh)
	}
	// Damage in every holder: nothing is listed.
	damagePacks(t, envs["n2"].Manager.Repo().StoreDir)
	repo1 := envs["n1"].Manager.Repo()
	if err := repo1.Remove("c", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := repo1.GC(context.Background(), image.GCOptions{Keep: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := fetchOnN1(t, ca, addrs, "n2", "n3"); err == nil {
		t.Fatal("a fetch from two damaged holders succeeded")
	}
	if _, err := repo1.Load("c", 1); err == nil {
		t.Fatal("a failed fetch listed the image")
	}
}

// TestFetchHolderManifestDamaged: a holder whose copy of the image's
// manifest does not verify refuses the head as damaged; everything comes
// from the other holder, and the reply names the first damaged (so that
// the coordinator repairs it).
func TestFetchHolderManifestDamaged(t *testing.T) {
	ca, addrs, envs := holders(t, 8)
	repo3 := envs["n3"].Manager.Repo()
	rec, err := repo3.Load("c", 1)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(repo3.StoreDir, "manifests", rec.Manifest.String())
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	img, err := fetchOnN1(t, ca, addrs, "n3", "n2")
	if err != nil {
		t.Fatal(err)
	}
	verified(t, envs["n1"])
	if sh := share(img, "n3"); !sh.Damaged || sh.Chunks != 0 || !strings.Contains(sh.Error, "manifest") {
		t.Errorf("holder n3 with a damaged manifest: %+v, want it named damaged, no chunk taken from it", sh)
	}
	if sh := share(img, "n2"); sh.Damaged || sh.Error != "" || sh.Chunks == 0 {
		t.Errorf("intact holder n2: %+v", sh)
	}
}

// TestFetchHolderDies: a holder whose connections are cut in the middle
// of the fetch is given up, not called damaged, and the other holder
// sends what it had left.
func TestFetchHolderDies(t *testing.T) {
	ca, addrs, envs := holders(t, 32)
	addrs["n3"] = cutAfter(t, addrs["n3"], 3<<20)
	img, err := fetchOnN1(t, ca, addrs, "n2", "n3")
	if err != nil {
		t.Fatal(err)
	}
	verified(t, envs["n1"])
	if sh := share(img, "n3"); sh.Error == "" || sh.Damaged || sh.Chunks >= 32<<20>>12 {
		t.Errorf("cut holder n3: %+v, want it given up, not damaged", sh)
	}
	if sh := share(img, "n2"); sh.Chunks == 0 || sh.Error != "" {
		t.Errorf("holder n2: %+v", sh)
	}
	t.Logf("shares: %+v", img.Holders)
}

// damagePacks flips a byte every 64 KiB of every pack in a store.
func damagePacks(t *testing.T, storeDir string) {
	t.Helper()
	n := 0
	filepath.WalkDir(filepath.Join(storeDir, "packs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for off := 4096; off < len(b); off += 64 << 10 {
			b[off] ^= 0xff
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		n++
		return nil
	})
	if n == 0 {
		t.Fatalf("no pack under %s", storeDir)
	}
}

// cutAfter forwards connections to addr until limit bytes have come back
// from it in all, then cuts every connection and refuses new ones, as a
// node that dies does. It returns the address to dial instead.
func cutAfter(t *testing.T, addr string, limit int64) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		sent  atomic.Int64
		once  sync.Once
		wg    sync.WaitGroup
	)
	cut := func() {
		once.Do(func() {
			ln.Close()
			mu.Lock()
			defer mu.Unlock()
			for _, c := range conns {
				c.Close()
			}
		})
	}
	t.Cleanup(func() { cut(); wg.Wait() })
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			wg.Go(func() { io.Copy(out, in); out.Close() })
			wg.Go(func() {
				buf := make([]byte, 32<<10)
				for {
					k, err := out.Read(buf)
					if k > 0 {
						if sent.Add(int64(k)) > limit {
							cut()
							return
						}
						if _, err := in.Write(buf[:k]); err != nil {
							return
						}
					}
					if err != nil {
						in.Close()
						return
					}
				}
			})
		}
	})
	return ln.Addr().String()
}

// TestFetchPromoted: a restart's fetch of an image that a rate-limited
// background replication is already fetching to the node waits for that
// fetch and lifts its limit, rather than waiting behind it at 1 MiB/s.
func TestFetchPromoted(t *testing.T) {
	ca, addrs, envs := holders(t, 16)
	c := rpc.NewAgentClient(addrs["n1"], "n1", issue(t, ca, "coord", pki.Coordinator))
	defer c.Close()
	ctx := context.Background()
	bg := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := c.Fetch(ctx, agentv1.Fetch{Container: "c", Seq: 1, From: addrs["n2"], FromNode: "n2", Rate: 1 << 20, Background: true})
		bg <- err
	}()
	time.Sleep(time.Second) // the replication is under way, at 1 MiB/s: 16 s for the image
	img, err := fetchOnN1(t, ca, addrs, "n3")
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if err := <-bg; err != nil {
		t.Fatalf("the promoted replication: %v", err)
	}
	verified(t, envs["n1"])
	if img.Fetched {
		t.Errorf("the restart's fetch fetched again (%+v) instead of waiting for the one under way", img.Holders)
	}
	// 16 MiB at the replication's 1 MiB/s would take 16 s.
	if took > 10*time.Second {
		t.Errorf("the restart's fetch took %s: it waited behind the rate-limited replication", took)
	}
	t.Logf("the restart's fetch returned after %s", took)
}

// TestChunkDataVersions: a holder answers a request that names no chunk
// stream version (what a release that knows only version 1 sends) with
// version 1, one that asks for version 2 with version 2, and refuses one
// it does not know; the receiver reads both.
func TestChunkDataVersions(t *testing.T) {
	ctx := context.Background()
	ca, addrs, envs := holders(t, 1)
	ids, err := envs["n2"].Manager.Repo().ChunkIDs(ctx, "c", 1)
	if err != nil {
		t.Fatal(err)
	}
	c := rpc.NewAgentClient(addrs["n2"], "n2", issue(t, ca, "n1", pki.Agent))
	defer c.Close()
	req := agentv1.ChunkData{Container: "c", Seq: 1}
	for _, id := range ids {
		req.IDs = append(req.IDs, id.String())
	}
	for asked, want := range map[int]byte{0: store.ChunkStreamV1, store.ChunkStreamV1: store.ChunkStreamV1, store.ChunkStreamV2: store.ChunkStreamV2} {
		req.Version = asked
		body, err := c.ChunkData(ctx, req)
		if err != nil {
			t.Fatalf("version %d: %v", asked, err)
		}
		b, err := io.ReadAll(body)
		body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < len(store.ChunkStreamMagic)+1 || b[len(store.ChunkStreamMagic)] != want {
			t.Fatalf("asked for version %d: the stream starts %q, want version %d", asked, b[:min(len(b), 8)], want)
		}
		if n, err := store.ReadChunks(ctx, bytes.NewReader(b), ids, func(store.ID, []byte) error { return nil }); err != nil || n != len(ids) {
			t.Fatalf("version %d: read %d of %d chunks: %v", asked, n, len(ids), err)
		}
	}
	req.Version = 3
	if body, err := c.ChunkData(ctx, req); err == nil {
		body.Close()
		t.Fatal("version 3 was served")
	} else if !strings.Contains(err.Error(), "version 3") {
		t.Fatalf("version 3: %v", err)
	}
}
