package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// FormatVersion is the version of the plain directory image format.
const FormatVersion = 1

// ManifestName is the manifest's file name inside an image directory.
const ManifestName = "manifest.json"

// DeltaName is the fs delta's file name inside an image directory.
const DeltaName = "fs.tar"

// CRIUDir is the directory of CRIU image files inside an image directory.
const CRIUDir = "criu"

// ErrCorrupt is returned when an image does not match its manifest: a file
// missing, truncated, grown, or with another hash, or a manifest that does
// not parse. Use errors.As with *CorruptError for the details.
var ErrCorrupt = errors.New("checkpoint image corrupt")

// ErrNotFound is returned for a checkpoint that does not exist.
var ErrNotFound = errors.New("checkpoint not found")

// CorruptError names the image and the file that failed verification.
type CorruptError struct {
	Image  string // image directory
	File   string // file inside it ("" for the manifest itself)
	Reason string
}

func (e *CorruptError) Error() string {
	if e.File == "" {
		return fmt.Sprintf("checkpoint %s corrupt: manifest: %s", e.Image, e.Reason)
	}
	return fmt.Sprintf("checkpoint %s corrupt: %s: %s", e.Image, e.File, e.Reason)
}

func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// File is one file of an image, as recorded in the manifest.
type File struct {
	Path   string `json:"path"` // slash-separated, relative to the image directory
	Size   int64  `json:"size"`
	BLAKE3 string `json:"blake3"` // hex BLAKE3-256 of the contents
}

// Timing records where a checkpoint's time went, in nanoseconds.
type Timing struct {
	Stall   time.Duration `json:"stall_ns"`   // container frozen: pause .. resume
	Capture time.Duration `json:"capture_ns"` // fs delta written to staging
	Dump    time.Duration `json:"dump_ns"`    // CRIU dump via runc
	Persist time.Duration `json:"persist_ns"` // staging -> image dir, hashed and fsynced
	Total   time.Duration `json:"total_ns"`
}

// Manifest describes one image. Config is the container's configuration as
// the container package recorded it, kept opaque here.
type Manifest struct {
	Version     int             `json:"version"`
	Container   string          `json:"container"`
	Seq         int             `json:"seq"`
	Created     time.Time       `json:"created"`
	CRIUVersion string          `json:"criu_version"`
	Kernel      string          `json:"kernel"`
	Stopped     bool            `json:"stopped"` // the container was stopped after the dump
	Config      json.RawMessage `json:"config"`
	Delta       DeltaStats      `json:"fs_delta"`
	Timing      Timing          `json:"timing"`
	Files       []File          `json:"files"`
}

// Size is the sum of the image's file sizes.
func (m *Manifest) Size() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// Name is how users refer to the image: container:seq.
func (m *Manifest) Name() string { return fmt.Sprintf("%s:%d", m.Container, m.Seq) }
