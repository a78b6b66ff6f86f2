package catalog_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"os"

	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/pki"
)

// TestFence: a leader's writes take effect while it leads and fail with
// ErrDeposed once another has taken over, however they are made; a
// conflict of a transaction's own conditions stays a conflict.
func TestFence(t *testing.T) {
	ctx := testContext(t)
	e := startEmbedded(t, t.TempDir())
	old, next := open(t, e), open(t, e)

	c1, err := old.Candidate(ctx, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	key, rev, err := c1.Campaign(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	old.Fence(key, rev)
	if err := old.Put(ctx, "jobs/a", "one"); err != nil {
		t.Fatalf("Put while leading: %v", err)
	}
	if _, err := old.Txn(ctx, []catalog.Cond{catalog.IfRevision("jobs/a", 1)}, catalog.PutOp("jobs/a", "x")); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("Txn with a stale condition while leading: %v, want ErrConflict", err)
	}
	if v, err := next.Leader(ctx); err != nil || v != "c1" {
		t.Fatalf("Leader = %q, %v; want c1", v, err)
	}

	c2, err := next.Candidate(ctx, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	won := make(chan error, 1)
	go func() {
		k, r, err := c2.Campaign(ctx, "c2")
		if err == nil {
			next.Fence(k, r)
		}
		won <- err
	}()
	select {
	case err := <-won:
		t.Fatalf("a second candidate won while the first leads (%v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	// The first leader stops keeping its session alive, as a paused or
	// cut-off process does, and loses.
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-won; err != nil {
		t.Fatalf("second candidate: %v", err)
	}
	if err := next.Put(ctx, "jobs/a", "two"); err != nil {
		t.Fatalf("new leader's Put: %v", err)
	}
	var rec string
	_, getRev := mustGet(t, old, "jobs/a", &rec)
	writes := map[string]func() error{
		"Put":          func() error { return old.Put(ctx, "jobs/a", "stale") },
		"Create":       func() error { return old.Create(ctx, "jobs/b", "stale") },
		"Delete":       func() error { return old.Delete(ctx, "jobs/a") },
		"DeletePrefix": func() error { _, err := old.DeletePrefix(ctx, "jobs/"); return err },
		"Txn": func() error {
			_, err := old.Txn(ctx, []catalog.Cond{catalog.IfRevision("jobs/a", getRev)}, catalog.PutOp("jobs/a", "stale"))
			return err
		},
		"Update": func() error {
			var v string
			return old.Update(ctx, "jobs/a", &v, func() error { v = "stale"; return nil })
		},
		"Register": func() error { _, err := old.Register(ctx, "n1", 2*time.Second); return err },
	}
	for name, write := range writes {
		if err := write(); !errors.Is(err, catalog.ErrDeposed) {
			t.Errorf("%s by the deposed leader: %v, want ErrDeposed", name, err)
		}
	}
	if _, _ = mustGet(t, next, "jobs/a", &rec); rec != "two" {
		t.Errorf("jobs/a = %q after the deposed leader's writes, want two", rec)
	}
	if _, _, err := next.GetRaw(ctx, "jobs/b"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("jobs/b written by the deposed leader: %v", err)
	}
	if v, err := next.Leader(ctx); err != nil || v != "c2" {
		t.Errorf("Leader = %q, %v; want c2", v, err)
	}
}

func mustGet(t *testing.T, c *catalog.Catalog, key string, v any) (*catalog.Catalog, int64) {
	t.Helper()
	rev, err := c.Get(testContext(t), key, v)
	if err != nil {
		t.Fatalf("Get %s: %v", key, err)
	}
	return c, rev
}

// TestMembers: three embedded members over mutual TLS make one cluster
// that goes on when one of them stops, and refuses a peer whose
// certificate is not a coordinator's.
func TestMembers(t *testing.T) {
	ctx := testContext(t)
	ca, err := pki.Init(filepath.Join(t.TempDir(), "pki"), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lo := net.IPv4(127, 0, 0, 1)
	creds := func(name string, role pki.Role) catalog.TLSFiles {
		c, err := ca.Issue(name, role, pki.IssueOptions{IPs: []net.IP{lo}})
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(t.TempDir(), name)
		if err := c.Write(dir); err != nil {
			t.Fatal(err)
		}
		return catalog.TLSFiles{CA: filepath.Join(dir, pki.CACertFile), Cert: filepath.Join(dir, pki.CertFile), Key: filepath.Join(dir, pki.KeyFile)}
	}
	peers := map[string]string{}
	for _, n := range []string{"c1", "c2", "c3"} {
		peers[n] = "https://" + freeLoopback(t)
	}
	files := creds("coordinator", pki.Coordinator)
	members := map[string]*catalog.Embedded{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range []string{"c1", "c2", "c3"} {
		wg.Go(func() {
			e, err := catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: t.TempDir(), Logger: testLogger(t),
				Member: &catalog.Member{Name: n, Peers: peers, Token: "test", TLS: files, PeerCN: "coordinator"}})
			if err != nil {
				t.Errorf("member %s: %v", n, err)
				return
			}
			mu.Lock()
			members[n] = e
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, e := range members {
		t.Cleanup(func() { e.Close() })
	}
	if t.Failed() {
		t.FailNow()
	}
	c1, c3 := open(t, members["c1"]), open(t, members["c3"])
	if err := c1.Put(ctx, "jobs/a", "one"); err != nil {
		t.Fatal(err)
	}
	var v string
	if _, err := c3.Get(ctx, "jobs/a", &v); err != nil || v != "one" {
		t.Fatalf("jobs/a on c3 = %q, %v; want one", v, err)
	}
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := members["c1"].Close(); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c3.Put(wctx, "jobs/a", "two"); err != nil {
		t.Fatalf("write with 2 of 3 members: %v", err)
	}

	// Only a coordinator's certificate is let in as a peer: etcd's peer
	// API answers one, not an agent's of the same CA.
	for _, tc := range []struct {
		files catalog.TLSFiles
		ok    bool
	}{{files, true}, {creds("n1", pki.Agent), false}} {
		cert, err := tls.LoadX509KeyPair(tc.files.Cert, tc.files.Key)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pem, _ := os.ReadFile(tc.files.CA)
		pool.AppendCertsFromPEM(pem)
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			Certificates: []tls.Certificate{cert}, RootCAs: pool}}}
		resp, err := hc.Get(peers["c3"] + "/members")
		if err == nil {
			resp.Body.Close()
		}
		if got := err == nil && resp.StatusCode == http.StatusOK; got != tc.ok {
			t.Errorf("peer API to a client of certificate %s: %v (status %v), want reached %v", tc.files.Cert, err, resp, tc.ok)
		}
	}
}

// freeLoopback returns a free port on 127.0.0.1 as host:port.
func freeLoopback(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
