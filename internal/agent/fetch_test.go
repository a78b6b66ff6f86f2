package agent_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/store"
)

// exportStream ingests a small image as c:1 in a new repo and returns its
// export stream and chunk ids, with the record edited by edit, as a
// hostile peer could send it.
func exportStream(t *testing.T, edit func(rec map[string]any)) ([]byte, []string) {
	t.Helper()
	ctx := context.Background()
	d := t.TempDir()
	repo := image.Repo{Dir: filepath.Join(d, "cat"), StoreDir: filepath.Join(d, "store"), Compression: store.CompressionFastest}
	src := imageSource(t, nil)
	if err := repo.Ingest(ctx, src, &image.Record{Container: "c", Seq: 1, Config: []byte(`{}`)}, nil); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := repo.Export(ctx, "c", 1, &buf, nil); err != nil {
		t.Fatal(err)
	}
	ids, err := repo.ChunkIDs(ctx, "c", 1)
	if err != nil {
		t.Fatal(err)
	}
	hex := make([]string, len(ids))
	for i, id := range ids {
		hex[i] = id.String()
	}
	file := buf.Bytes()
	k := binary.LittleEndian.Uint32(file[8:])
	var rec map[string]any
	if err := json.Unmarshal(file[12:12+k], &rec); err != nil {
		t.Fatal(err)
	}
	edit(rec)
	meta, _ := json.Marshal(rec)
	out := append([]byte(nil), file[:8]...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(meta)))
	out = append(out, meta...)
	out = append(out, file[12+k:len(file)-store.IDSize]...)
	sum := store.Hash(out)
	return append(out, sum[:]...), hex
}

// imageSource writes a small image to ingest (a core file, pages if
// given, an fs delta of one file) and returns its dir.
func imageSource(t *testing.T, pages []byte) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	if err := os.MkdirAll(filepath.Join(src, image.CRIUDir), 0o700); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"core-1.img": []byte("core")}
	if pages != nil {
		files["pages-1.img"] = pages
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(src, image.CRIUDir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var delta bytes.Buffer
	tw := tar.NewWriter(&delta)
	tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
	tw.Write([]byte("x"))
	tw.Close()
	if err := os.WriteFile(filepath.Join(src, image.DeltaName), delta.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return src
}

// hostilePeer serves, as agent n2 of the cluster, one export stream for
// whatever image is asked for.
func hostilePeer(t *testing.T, cl *cluster, stream []byte, ids []string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	creds := issue(t, cl.ca, "n2", pki.Agent, net.ParseIP("127.0.0.1"))
	srv := &http.Server{
		TLSConfig: pki.ServerConfig(creds),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case agentv1.PathChunks:
				json.NewEncoder(w).Encode(agentv1.Chunks{IDs: ids})
			case agentv1.PathExport, agentv1.PathExportDelta:
				w.Write(stream)
			default:
				http.NotFound(w, r)
			}
		}),
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// TestFetchRefusesHostilePeer: an image fetched from a peer must be the
// one asked for, under a valid name, before anything of it is saved: a
// peer that sends another checkpoint, or a name that is a path, gets
// nothing listed and nothing written outside the data dir.
func TestFetchRefusesHostilePeer(t *testing.T) {
	cl, env := startAgent(t)
	ctx := context.Background()
	c := rpc.NewAgentClient(cl.addr, "n1", issue(t, cl.ca, "coord", pki.Coordinator))
	defer c.Close()
	repo := env.Manager.Repo()
	outside := filepath.Join(repo.Dir, "..", "..", "x")
	tests := []struct {
		name string
		edit func(rec map[string]any)
	}{
		{"another container", func(rec map[string]any) { rec["container"] = "evil" }},
		{"another seq", func(rec map[string]any) { rec["seq"] = 7 }},
		{"path as name", func(rec map[string]any) { rec["container"] = "../../x" }},
		{"absolute name", func(rec map[string]any) { rec["container"] = "/abs" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stream, ids := exportStream(t, tc.edit)
			peer := hostilePeer(t, cl, stream, ids)
			_, err := c.Fetch(ctx, agentv1.Fetch{Container: "c", Seq: 1, From: peer, FromNode: "n2"})
			apiErr(t, err, agentv1.CodeCorrupt)
			if recs, errs := repo.All(); len(recs) != 0 || len(errs) != 0 {
				t.Fatalf("after a refused fetch the catalog lists %v (%v)", recs, errs)
			}
			if ents, _ := os.ReadDir(repo.Dir); len(ents) != 0 {
				t.Fatalf("after a refused fetch the catalog holds %d entries", len(ents))
			}
			if _, err := os.Stat(outside); err == nil {
				t.Fatalf("fetch wrote %s", outside)
			}
		})
	}
	t.Run("bad request", func(t *testing.T) {
		_, err := c.Fetch(ctx, agentv1.Fetch{Container: "../x", Seq: 1, From: "127.0.0.1:1", FromNode: "n2"})
		apiErr(t, err, agentv1.CodeBadRequest)
		_, err = c.Fetch(ctx, agentv1.Fetch{Container: "c", Seq: 0, From: "127.0.0.1:1", FromNode: "n2"})
		apiErr(t, err, agentv1.CodeBadRequest)
	})
}
