package v1

import (
	"encoding/json"
	"time"
)

// The durable tier (docs/hpc.md): a bucket of an S3-compatible object
// store, or a directory on a shared file system, named by a URL
// (s3://BUCKET/PREFIX, file:///DIR) that holds no credentials: each agent
// reaches it with the credentials of its own environment. Agents do every
// read and write of the tier; the coordinator asks them, and writes a
// global checkpoint's record (through one agent) only once every image it
// names is flushed.
const (
	PathTierFlush  = "/v1/tier/flush"  // POST TierFlush: TierFlushed
	PathTierFetch  = "/v1/tier/fetch"  // POST TierFetch: Image
	PathTierRecord = "/v1/tier/record" // POST TierRecord: 204 (writes it)
	PathTierRead   = "/v1/tier/read"   // POST TierRead: TierRecord
	PathTierPrune  = "/v1/tier/prune"  // POST TierPrune: TierPruned
)

// TierFlush uploads checkpoint images of this node into the tier at URL:
// the chunks the tier lacks, then each manifest.
type TierFlush struct {
	URL    string     `json:"url"`
	Images []ImageRef `json:"images"`
}

// ImageRef names a checkpoint image: container:seq.
type ImageRef struct {
	Container string `json:"container"`
	Seq       int    `json:"seq"`
}

// TierFlushed is the reply to TierFlush: one entry per image, in the
// order asked.
type TierFlushed struct {
	Images []TierImage `json:"images"`
}

// TierImage is one image flushed: its record (what TierFetch takes back)
// and what its flush uploaded.
type TierImage struct {
	ImageRef
	Manifest  string          `json:"manifest"` // the image's manifest ID
	Record    json.RawMessage `json:"record"`
	Chunks    int             `json:"chunks"`     // chunks the image references
	NewChunks int             `json:"new_chunks"` // of them, those the tier lacked
	Bytes     int64           `json:"bytes"`      // bytes uploaded
	Duration  time.Duration   `json:"duration_ns"`
}

// TierFetch brings checkpoint Container:Seq from the tier at URL into
// this node's store, Record being its record as flushed: hostile input,
// checked (names, manifest, shape, config) before any chunk is fetched,
// and every chunk verified. An image already here is not fetched again.
type TierFetch struct {
	URL string `json:"url"`
	ImageRef
	Record json.RawMessage `json:"record"`
}

// TierRecord is the tier's record of global checkpoint Seq (Data, as the
// coordinator encodes it: coordv1.TierCkpt). Written once every image it
// names is flushed, it replaces any other record of that number.
type TierRecord struct {
	URL  string          `json:"url"`
	Seq  int             `json:"seq"`
	Data json.RawMessage `json:"data"`
}

// TierRead reads the record of global checkpoint Seq from the tier at URL,
// or the newest one with Seq 0. The reply is a TierRecord (without URL).
type TierRead struct {
	URL string `json:"url"`
	Seq int    `json:"seq,omitempty"`
}

// TierPrune deletes from the tier at URL every checkpoint record but
// those of Records, then every manifest but Manifests and every chunk no
// kept manifest references.
type TierPrune struct {
	URL       string   `json:"url"`
	Records   []int    `json:"records"`
	Manifests []string `json:"manifests"`
}

// TierPruned is the reply to TierPrune.
type TierPruned struct {
	Records   int   `json:"records"`   // records deleted
	Manifests int   `json:"manifests"` // manifests deleted
	Packs     int   `json:"packs"`     // packs deleted or repacked
	Bytes     int64 `json:"bytes"`     // bytes of the packs deleted
}
