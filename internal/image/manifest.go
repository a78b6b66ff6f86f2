package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cairn-hpc/cairn/internal/store"
)

// RecordVersion is the version of the catalog record format.
const RecordVersion = 2

// Names inside a staged image directory (what a checkpoint captures before
// it is ingested) and inside an image's store manifest.
const (
	CRIUDir   = "criu"   // CRIU's image files
	DeltaName = "fs.tar" // the fs delta as captured, staging only
	FSDir     = "fs"     // the fs delta as a tree, in the manifest
	// LogName is the container's output up to the checkpoint, a plain
	// file in both (optional: images from before it was kept lack it).
	LogName = "log"
	// LogTimesName says when the bytes of LogName came (package
	// container's format), beside it in both (optional too).
	LogTimesName = LogName + TimesSuffix
)

// TimesSuffix names the file of when a log's bytes came beside the log.
const TimesSuffix = ".times"

// TimesOf is the file of when the bytes of the log at path came.
func TimesOf(path string) string { return path + TimesSuffix }

// outputFiles are the files of an image that hold the container's output.
var outputFiles = []string{LogName, LogTimesName}

// isOutput reports whether a manifest path is one of the output files.
func isOutput(path string) bool { return slices.Contains(outputFiles, path) }

// ErrCorrupt is returned when an image cannot be read back intact: a
// chunk, manifest or record that is damaged or missing. Use errors.As with
// *CorruptError for the details.
var ErrCorrupt = errors.New("checkpoint image corrupt")

// ErrNotFound is returned for a checkpoint that does not exist.
var ErrNotFound = errors.New("checkpoint not found")

// CorruptError names the image, what failed, and every checkpoint that
// shares the damaged data.
type CorruptError struct {
	Image    string   // container:seq
	What     string   // "chunk ID", "manifest ID", "record", a file path
	Reason   string   //
	Affected []string // every checkpoint whose image uses the damaged data
	Err      error    // the underlying store error, if any
}

func (e *CorruptError) Error() string {
	s := fmt.Sprintf("checkpoint %s corrupt: %s: %s", e.Image, e.What, e.Reason)
	if len(e.Affected) > 0 {
		s += fmt.Sprintf(" (affects checkpoints %v)", e.Affected)
	}
	return s
}

// Is matches ErrCorrupt.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// Unwrap returns the store's error.
func (e *CorruptError) Unwrap() error { return e.Err }

// Timing records where a checkpoint's time went.
type Timing struct {
	Stall   time.Duration `json:"stall_ns"`   // container frozen: freeze .. thaw
	Capture time.Duration `json:"capture_ns"` // fs delta written to staging
	Dump    time.Duration `json:"dump_ns"`    // CRIU dump via runc
	Persist time.Duration `json:"persist_ns"` // staging ingested into the store
	Total   time.Duration `json:"total_ns"`
}

// Record is the catalog entry of one image: what was captured, when, with
// which CRIU, the container's config, and the store manifest that holds the
// image's files. The record is written last, after the manifest is durable,
// so a listed checkpoint is always complete.
//
// A files-only image (FilesOnly, an application-level checkpoint) holds
// the container's written files and its output but not its processes: no
// CRIU files, and no CRIUVersion. A restore starts the container's command
// afresh on those files. The field is absent from the JSON of every image
// CRIU dumped, older ones included.
type Record struct {
	Version     int             `json:"version"`
	Container   string          `json:"container"`
	Seq         int             `json:"seq"`
	Created     time.Time       `json:"created"`
	CRIUVersion string          `json:"criu_version"`
	Kernel      string          `json:"kernel"`
	Stopped     bool            `json:"stopped"`              // the container was stopped after the dump
	FilesOnly   bool            `json:"files_only,omitempty"` // no processes: see above
	Pinned      bool            `json:"pinned"`               // kept by gc whatever the retention policy
	Config      json.RawMessage `json:"config"`
	Delta       DeltaStats      `json:"fs_delta"`
	Timing      Timing          `json:"timing"`
	Manifest    store.ID        `json:"manifest"`     // the image's files in the store
	Logical     int64           `json:"logical_size"` // bytes of all files of the image
	Files       int             `json:"files"`        // CRIU image files
	NewChunks   int             `json:"new_chunks"`   // chunks this ingest wrote
	NewBytes    int64           `json:"new_bytes"`    // raw bytes of those chunks
	// Log describes the container's output kept with the image (the file
	// LogName); nil for an image from before it was kept.
	Log *LogInfo `json:"log,omitempty"`
}

// LogInfo describes the container's output kept with an image (the file
// LogName): everything it printed up to the checkpoint.
type LogInfo struct {
	// Incarnation is the container's incarnation the checkpoint was taken
	// in (1: its first run); a restore from the image is a later one.
	Incarnation int   `json:"incarnation"`
	Bytes       int64 `json:"bytes"` // the output's length
}

// Size is the logical size of the image: its files' bytes.
func (r *Record) Size() int64 { return r.Logical }

// Name is how users refer to the image: container:seq.
func (r *Record) Name() string { return fmt.Sprintf("%s:%d", r.Container, r.Seq) }

// IsCorrupt reports whether err says an image is corrupt.
func IsCorrupt(err error) bool { return errors.Is(err, ErrCorrupt) }
