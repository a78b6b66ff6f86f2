package coord_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/memagent"
	"github.com/cairn-hpc/cairn/internal/events"
)

// newCatalog opens an empty catalog on an etcd of its own.
func newCatalog(t *testing.T) *catalog.Catalog {
	t.Helper()
	e, err := catalog.StartEmbedded(t.Context(), catalog.EmbeddedOptions{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	cat, err := catalog.Open(t.Context(), catalog.Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	return cat
}

// TestBackupRestore: a backup holds every record but the leased ones; a
// restore writes them all into an empty catalog, but the term, and
// refuses a catalog that is not empty and a file that is not a whole
// backup, writing nothing then.
func TestBackupRestore(t *testing.T) {
	x, err := events.New(events.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := newMemEnv(t, 3, memagent.Options{}, coord.Options{Events: x})
	mc := e.start()
	ctx := context.Background()
	mc.runJob(t, "ring", 2, 1)
	mc.checkpoint(t, "ring", 1)
	info, backup, err := mc.Backup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	buf := bytes.NewBuffer(backup)
	keys := map[string]bool{}
	if _, err := mc.cat.List(ctx, "", func(k string, _ []byte) error { keys[k] = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if info.Keys == 0 || info.Keys >= len(keys) {
		t.Fatalf("backup of %d keys of the catalog's %d: the leased ones (nodes alive) must be left out, the rest kept", info.Keys, len(keys))
	}

	cat := newCatalog(t)
	got, evs, err := coord.RestoreCatalog(ctx, cat, bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if got.Keys != info.Keys || got.Revision != info.Revision {
		t.Errorf("restored %+v, backed up %+v", got, info)
	}
	restored := map[string]bool{}
	if _, err := cat.List(ctx, "", func(k string, _ []byte) error { restored[k] = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(restored) != info.Keys-1 {
		t.Errorf("restored %d keys of %d (all but the term)", len(restored), info.Keys)
	}
	for k := range restored {
		if !keys[k] {
			t.Errorf("restored %s, which the catalog did not hold", k)
		}
	}
	if restored["counters/term"] {
		t.Error("the term was restored: agents that saw a newer one would refuse the restored coordinator")
	}
	var j coordv1.Job
	if _, err := cat.Get(ctx, "jobs/ring", &j); err != nil || j.LastCkpt != 1 {
		t.Errorf("restored job ring: %+v %v", j, err)
	}
	if len(evs) == 0 {
		t.Error("no event history restored")
	}

	// A second restore into it, and backups cut short or tampered with.
	if _, _, err := coord.RestoreCatalog(ctx, cat, bytes.NewReader(buf.Bytes())); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("restore into a catalog that is not empty: %v", err)
	}
	var dropped bytes.Buffer // the events file left out
	tr, tw := tar.NewReader(bytes.NewReader(buf.Bytes())), tar.NewWriter(&dropped)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Name == "events.jsonl" {
			continue
		}
		tw.WriteHeader(h)
		io.Copy(tw, tr)
	}
	tw.Close()
	for name, b := range map[string][]byte{
		"cut short":   buf.Bytes()[:buf.Len()/2],
		"no events":   dropped.Bytes(),
		"not a tar":   []byte("root:x:0:0:root:/root:/bin/bash\n"),
		"another tar": tarOf(t, "backup.json", `{"keys": 1}`, "catalog.jsonl", "{\"key\": \"x\", \"value\": nope}\n", "events.jsonl", ""),
	} {
		empty := newCatalog(t)
		_, _, err := coord.RestoreCatalog(ctx, empty, bytes.NewReader(b))
		if !errors.Is(err, coord.ErrBadBackup) {
			t.Errorf("%s: %v, want ErrBadBackup", name, err)
		}
		n := 0
		empty.List(ctx, "", func(string, []byte) error { n++; return nil })
		if n != 0 {
			t.Errorf("%s: %d keys written", name, n)
		}
	}
}

// tarOf makes a tar of name, content pairs.
func tarOf(t *testing.T, pairs ...string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for i := 0; i < len(pairs); i += 2 {
		if err := tw.WriteHeader(&tar.Header{Name: pairs[i], Mode: 0o600, Size: int64(len(pairs[i+1])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(pairs[i+1]))
	}
	tw.Close()
	return b.Bytes()
}
