package image

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cairn-hpc/cairn/internal/names"
)

// A staged-image stream moves a staged image (CRIU's files under CRIUDir
// and the fs delta DeltaName, as a checkpoint's dump leaves them) from one
// node's staging to another's, for a migration: a tar of plain files, the
// record (StagedRecord) first, then the fs delta, then CRIU's files, then
// the container's output (LogName) and its times (LogTimesName) if the
// image kept them. The
// sender announces the bytes of those files (the record included) before
// the stream; the receiver takes no more.

// StagedRecord is the name of the record in a staged-image stream.
const StagedRecord = "record.json"

// StagedHoleSize is the PAX record that makes an entry of a staged-image
// stream a hole (WriteStagedLazy): a pages file sent without its bytes,
// of the size it names, which the receiver creates empty of that size.
const StagedHoleSize = "CAIRN.hole-size"

// Bounds of a staged-image stream, whatever its sender announces.
var (
	// MaxStagedSize bounds the announced size: a rank's memory and files,
	// staged in tmpfs.
	MaxStagedSize int64 = 256 << 30
	// maxStagedFiles bounds the files of a stream (CRIU writes a few per
	// process and thread).
	maxStagedFiles = 1 << 16
	// maxStagedRecord bounds the record.
	maxStagedRecord int64 = 1 << 20
)

// stagedFraming bounds the bytes of a stream besides its files' contents:
// a header and padding per file, an extended header for a long name or a
// large size, and the end of the archive.
const stagedFraming = 4 << 10

// ErrStagedTooLarge is returned, wrapped, for a staged-image stream larger
// than its sender announced or than MaxStagedSize.
var ErrStagedTooLarge = errors.New("staged image larger than announced")

// stagedFiles lists the files of the staged image in dir, in stream order
// (the record aside), with their sizes.
func stagedFiles(dir string) ([]string, []int64, error) {
	files := []string{DeltaName}
	ents, err := os.ReadDir(filepath.Join(dir, CRIUDir))
	if err != nil {
		return nil, nil, err
	}
	for _, e := range ents {
		files = append(files, CRIUDir+"/"+e.Name())
	}
	for _, name := range outputFiles {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			files = append(files, name)
		}
	}
	sizes := make([]int64, len(files))
	for i, f := range files {
		fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(f)))
		if err != nil {
			return nil, nil, err
		}
		if !fi.Mode().IsRegular() {
			return nil, nil, fmt.Errorf("staged image: %s is not a regular file", f)
		}
		sizes[i] = fi.Size()
	}
	return files, sizes, nil
}

// WriteStaged writes the staged image in dir with its record as a
// staged-image stream to w. Before it writes anything it calls announce
// with the stream's size (its files' bytes, the record included), which
// the receiver gives ReceiveStaged. An error before announce is called
// means nothing was written.
func WriteStaged(w io.Writer, dir string, rec *Record, announce func(size int64)) error {
	return writeStaged(w, dir, rec, false, announce)
}

// WriteStagedLazy writes a staged-image stream as WriteStaged does, but
// for the bytes of CRIU's pages files: each is a hole of its size
// (StagedHoleSize), for a post-copy migration, whose receiver reads the
// pages from the sender as the restored processes need them.
func WriteStagedLazy(w io.Writer, dir string, rec *Record, announce func(size int64)) error {
	return writeStaged(w, dir, rec, true, announce)
}

func writeStaged(w io.Writer, dir string, rec *Record, holes bool, announce func(size int64)) error {
	recJSON, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	files, sizes, err := stagedFiles(dir)
	if err != nil {
		return err
	}
	hole := func(f string) bool {
		base, ok := strings.CutPrefix(f, CRIUDir+"/")
		return holes && ok && IsPages(base)
	}
	size := int64(len(recJSON))
	for i, n := range sizes {
		if !hole(files[i]) {
			size += n
		}
	}
	announce(size)
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: StagedRecord, Mode: 0o600, Size: int64(len(recJSON)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(recJSON); err != nil {
		return err
	}
	for i, f := range files {
		if hole(f) {
			hdr := &tar.Header{Name: f, Mode: 0o600, Typeflag: tar.TypeReg, Format: tar.FormatPAX,
				PAXRecords: map[string]string{StagedHoleSize: strconv.FormatInt(sizes[i], 10)}}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			continue
		}
		if err := writeStagedFile(tw, filepath.Join(dir, filepath.FromSlash(f)), f, sizes[i]); err != nil {
			return fmt.Errorf("staged image: %s: %w", f, err)
		}
	}
	return tw.Close()
}

func writeStagedFile(tw *tar.Writer, path, name string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: size, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err = io.CopyN(tw, f, size)
	return err
}

// ReceiveStaged unpacks a staged-image stream into dir (which must exist
// and be empty), taking at most the announced size (WriteStaged) and
// MaxStagedSize, and only what a staged image holds: the record, naming a
// valid container and checkpoint number; the fs delta, every entry of
// which must pass the checks restore applies (no "..", no absolute path,
// no device but whiteouts, no link out of the delta); at least one of
// CRIU's files, all plain files directly under CRIUDir (none, for a
// files-only image as its record says); and the container's output
// LogName and LogTimesName if the sender kept them; each once. A pages
// file may come as a hole (WriteStagedLazy), made empty of its size. Nothing
// is written outside dir. It returns the record and the bytes received.
// Every refusal wraps ErrCorrupt; a stream larger than announced also
// ErrStagedTooLarge.
func ReceiveStaged(r io.Reader, dir string, announced int64) (Record, int64, error) {
	var rec Record
	if announced < 0 || announced > MaxStagedSize {
		return rec, 0, stagedErr(fmt.Errorf("%w: announced size %d is outside 0..%d", ErrStagedTooLarge, announced, MaxStagedSize))
	}
	if err := os.Mkdir(filepath.Join(dir, CRIUDir), 0o700); err != nil {
		return rec, 0, err
	}
	// The stream itself: the files' bytes plus their framing.
	raw := &cappedReader{r: r, left: announced + int64(maxStagedFiles+2)*stagedFraming}
	tr := tar.NewReader(raw)
	left := announced // bytes of files still allowed
	var n, holes int64
	seen := map[string]bool{}
	criuFiles := 0
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return rec, n, stagedErr(err)
		}
		if err := checkStagedEntry(hdr, seen); err != nil {
			return rec, n, stagedErr(err)
		}
		seen[hdr.Name] = true
		if len(seen) > maxStagedFiles {
			return rec, n, stagedErr(fmt.Errorf("more than %d files", maxStagedFiles))
		}
		if hdr.Size > left {
			return rec, n, stagedErr(fmt.Errorf("%w: %s of %d bytes goes past the %d bytes announced", ErrStagedTooLarge, hdr.Name, hdr.Size, announced))
		}
		left -= hdr.Size
		if hdr.Name == StagedRecord {
			if err := readStagedRecord(tr, hdr.Size, &rec); err != nil {
				return rec, n, stagedErr(err)
			}
			n += hdr.Size
			continue
		}
		if strings.HasPrefix(hdr.Name, CRIUDir+"/") {
			criuFiles++
		}
		if size, ok := hdr.PAXRecords[StagedHoleSize]; ok {
			hole, err := receiveHole(hdr, size, dir)
			if err != nil {
				return rec, n, stagedErr(err)
			}
			if holes += hole; holes > MaxStagedSize {
				return rec, n, stagedErr(fmt.Errorf("%w: holes of more than %d bytes", ErrStagedTooLarge, MaxStagedSize))
			}
			continue
		}
		k, err := receiveStagedFile(tr, filepath.Join(dir, filepath.FromSlash(hdr.Name)), hdr.Name == DeltaName)
		n += k
		if err != nil {
			return rec, n, stagedErr(fmt.Errorf("%s: %w", hdr.Name, err))
		}
	}
	switch {
	case !seen[StagedRecord]:
		return rec, n, stagedErr(errors.New("no record"))
	case !seen[DeltaName]:
		return rec, n, stagedErr(errors.New("no fs delta"))
	case criuFiles == 0 && !rec.FilesOnly:
		return rec, n, stagedErr(errNoCRIUFiles)
	case criuFiles > 0 && rec.FilesOnly:
		return rec, n, stagedErr(errCRIUFilesOnly)
	}
	return rec, n, nil
}

func stagedErr(err error) error {
	return &CorruptError{Image: "staged", What: "staged image stream", Reason: err.Error(), Err: err}
}

// checkStagedEntry checks the header of a staged-image stream's entry
// against what such a stream holds.
func checkStagedEntry(hdr *tar.Header, seen map[string]bool) error {
	name := hdr.Name
	if hdr.Typeflag != tar.TypeReg {
		return fmt.Errorf("entry %q of type %q: only plain files", name, hdr.Typeflag)
	}
	if hdr.Size < 0 {
		return fmt.Errorf("entry %q of %d bytes", name, hdr.Size)
	}
	if seen[name] {
		return fmt.Errorf("entry %q twice", name)
	}
	if name == StagedRecord || name == DeltaName || isOutput(name) {
		return nil
	}
	base, inCRIU := strings.CutPrefix(name, CRIUDir+"/")
	switch {
	case strings.HasPrefix(name, "/"):
		return fmt.Errorf("entry %q: absolute path", name)
	case strings.Contains(name, "\x00"):
		return fmt.Errorf("entry %q: NUL in name", name)
	case !inCRIU:
		return fmt.Errorf("entry %q: neither the record, the fs delta, the output nor a file of %s/", name, CRIUDir)
	case base == "" || base == "." || base == "..":
		return fmt.Errorf("entry %q: not a file name", name)
	case strings.Contains(base, "/"):
		return fmt.Errorf("entry %q: not directly in %s/", name, CRIUDir)
	}
	return nil
}

func readStagedRecord(r io.Reader, size int64, rec *Record) error {
	if size > maxStagedRecord {
		return fmt.Errorf("record of %d bytes is above the %d byte limit", size, maxStagedRecord)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, rec); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	// As text: a bad name inside a stream is damage, not a caller's
	// mistake.
	if err := names.Container(rec.Container); err != nil {
		return fmt.Errorf("record: %v", err)
	}
	if err := names.Seq(rec.Seq); err != nil {
		return fmt.Errorf("record: %v", err)
	}
	return nil
}

// receiveHole makes the hole hdr names (StagedHoleSize, its value size)
// in dir: only a pages file of CRIU's, of whole pages, may be one.
func receiveHole(hdr *tar.Header, size, dir string) (int64, error) {
	base, ok := strings.CutPrefix(hdr.Name, CRIUDir+"/")
	n, err := strconv.ParseInt(size, 10, 64)
	switch {
	case !ok || !IsPages(base):
		return 0, fmt.Errorf("entry %q: a hole, and not a pages file of %s/", hdr.Name, CRIUDir)
	case hdr.Size != 0:
		return 0, fmt.Errorf("entry %q: a hole with %d bytes", hdr.Name, hdr.Size)
	case err != nil || n < 0 || n%pageSize != 0 || n > MaxStagedSize:
		return 0, fmt.Errorf("entry %q: a hole of %q bytes, not whole pages up to %d", hdr.Name, size, MaxStagedSize)
	}
	if err := sparse(filepath.Join(dir, filepath.FromSlash(hdr.Name)), n); err != nil {
		return 0, fmt.Errorf("%s: %w", hdr.Name, err)
	}
	return n, nil
}

// pageSize is the size of a page in CRIU's pages files.
const pageSize = 4096

// receiveStagedFile writes r to a new file at p. An fs delta is checked
// entry by entry on the way (checkDelta), as restore will unpack it.
func receiveStagedFile(r io.Reader, p string, delta bool) (int64, error) {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	cw := &countingWriter{w: f}
	if delta {
		tee := io.TeeReader(r, cw)
		err = checkDelta(tee)
		if err == nil {
			// The end of the archive and what follows it.
			_, err = io.Copy(io.Discard, tee)
		}
	} else {
		_, err = io.Copy(cw, r)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return cw.n, err
}

// checkDelta reads an fs delta tar and checks every entry as ingest and
// UnpackDelta do: checkHeader, and hard links only to files before them.
func checkDelta(r io.Reader) error {
	files := map[string]bool{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read fs delta: %w", err)
		}
		if err := checkHeader(hdr); err != nil {
			return err
		}
		name, _ := cleanName(hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeReg:
			files[name] = true
		case tar.TypeLink:
			target, _ := cleanName(hdr.Linkname)
			if !files[target] {
				return fmt.Errorf("%w: hard link %q to %q, which is not a file in the delta", ErrUnsafeEntry, name, target)
			}
		}
	}
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// cappedReader reads at most left bytes from r, and fails with
// ErrStagedTooLarge if r holds more.
type cappedReader struct {
	r    io.Reader
	left int64
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		var one [1]byte
		if n, _ := io.ReadFull(c.r, one[:]); n > 0 {
			return 0, ErrStagedTooLarge
		}
		return 0, io.EOF
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}
