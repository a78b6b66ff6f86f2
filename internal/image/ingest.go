package image

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cairn-hpc/cairn/internal/store"
)

// Ingest stores the staged image in src (CRIU's files under CRIUDir, the
// fs delta as the tar DeltaName and, if there, the container's output
// LogName) as checkpoint rec.Container:rec.Seq:
// every file is cut into chunks that are put into the store (only chunks
// it lacks are written), the image's manifest is written once they are
// durable, and the record last. On error no checkpoint is listed. A
// files-only image (rec.FilesOnly) has no CRIU files: CRIUDir must be
// absent or empty, and the manifest gets no criu directory.
func (r Repo) Ingest(ctx context.Context, src string, rec *Record, progress Progress) error {
	st, err := r.OpenWriter(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := os.Stat(r.recordPath(rec.Container, rec.Seq)); err == nil {
		return fmt.Errorf("checkpoint %s already exists", rec.Name())
	}
	var stats ingestStats
	total := dirBytes(src)
	stopProgress := startProgress(progress, &stats.bytes, total)
	defer stopProgress()

	now := time.Now()
	var nodes []store.Node
	criuDir := filepath.Join(src, CRIUDir)
	ents, err := os.ReadDir(criuDir)
	switch {
	case rec.FilesOnly && len(ents) > 0:
		return fmt.Errorf("files-only checkpoint %s: the staged image holds CRIU file %s", rec.Name(), ents[0].Name())
	case rec.FilesOnly && err != nil && !errors.Is(err, fs.ErrNotExist):
		return err
	case !rec.FilesOnly && err != nil:
		return err
	case !rec.FilesOnly:
		nodes = append(nodes, store.Node{Path: CRIUDir, Kind: store.KindDir, Mode: 0o700, MTime: now})
	}
	rec.Files = 0
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return fmt.Errorf("staged CRIU image holds non-regular file %s", e.Name())
		}
		name := CRIUDir + "/" + e.Name()
		ids, n, err := ingestFile(ctx, st, filepath.Join(criuDir, e.Name()), name, &stats)
		if err != nil {
			return err
		}
		nodes = append(nodes, store.Node{Path: name, Kind: store.KindFile, Mode: 0o600, MTime: now, Size: n, Chunks: ids})
		rec.Files++
	}
	fsNodes, err := ingestDelta(ctx, st, filepath.Join(src, DeltaName), &stats)
	if err != nil {
		return err
	}
	nodes = append(nodes, fsNodes...)
	// The container's output and its times, if the checkpoint kept them.
	for _, name := range outputFiles {
		fi, err := os.Lstat(filepath.Join(src, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("staged image: %s is not a regular file", name)
		}
		ids, n, err := ingestFile(ctx, st, filepath.Join(src, name), name, &stats)
		if err != nil {
			return err
		}
		nodes = append(nodes, store.Node{Path: name, Kind: store.KindFile, Mode: 0o600, MTime: now, Size: n, Chunks: ids})
	}
	m := &store.Manifest{
		Labels: map[string]string{"cairn.container": rec.Container, "cairn.seq": strconv.Itoa(rec.Seq)},
		Nodes:  nodes,
	}
	id, err := st.PutManifest(ctx, m)
	if err != nil {
		return fmt.Errorf("write checkpoint %s: %w", rec.Name(), err)
	}
	rec.Manifest = id
	rec.Logical = 0
	for _, n := range nodes {
		rec.Logical += int64(n.Size)
	}
	rec.NewChunks, rec.NewBytes = int(stats.newChunks.Load()), stats.newBytes.Load()
	if err := r.saveRecord(rec); err != nil {
		return fmt.Errorf("write checkpoint %s: %w", rec.Name(), err)
	}
	return nil
}

// ingestDelta turns the captured fs delta tar into manifest nodes under
// FSDir, refusing entries restore would refuse.
func ingestDelta(ctx context.Context, st *store.Store, tarPath string, stats *ingestStats) ([]store.Node, error) {
	f, err := os.Open(tarPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	nodes := []store.Node{{Path: FSDir, Kind: store.KindDir, Mode: 0o755, MTime: time.Now()}}
	files := map[string]int{} // tar name -> node index, for hard links
	tr := tar.NewReader(bufio.NewReaderSize(f, 1<<20))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nodes, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read fs delta: %w", err)
		}
		if err := checkHeader(hdr); err != nil {
			return nil, err
		}
		name, _ := cleanName(hdr.Name)
		n := nodeFromHeader(hdr, name)
		switch hdr.Typeflag {
		case tar.TypeReg:
			if n.Chunks, n.Size, err = putStream(ctx, st, tr, ParamsFor(name), stats); err != nil {
				return nil, fmt.Errorf("ingest %s: %w", name, err)
			}
			files[name] = len(nodes)
		case tar.TypeLink:
			// Stored as a copy: dedup makes it free, but the link itself
			// is not kept (see docs/format.md).
			target, _ := cleanName(hdr.Linkname)
			i, ok := files[target]
			if !ok {
				return nil, fmt.Errorf("%w: hard link %q to %q, which is not a file in the delta", ErrUnsafeEntry, name, target)
			}
			n.Size, n.Chunks = nodes[i].Size, nodes[i].Chunks
		}
		nodes = append(nodes, n)
	}
}

func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
