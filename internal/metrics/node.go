package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
)

// StoreStats are the figures of a node's store.
type StoreStats struct {
	Stored  int64 // the chunks' stored (compressed) bytes, each chunk once
	Raw     int64 // their raw bytes
	Logical int64 // the images' sizes as files, summed
	Chunks  int
	Packs   int
	Images  int // rank images (checkpoint records)
	// Quarantined counts the damaged packs set aside.
	Quarantined int
}

// SpaceStats are the bytes of a file system, and those a dir of it uses.
type SpaceStats struct {
	Size, Free uint64 // the file system's
	Used       int64  // the dir's files
	Kept       int64  // of Used, the images kept after their checkpoint (staging only)
}

// Probe is the last result of one health probe.
type Probe struct {
	Name string // disk, memory or command
	OK   bool
}

// NodeOptions say where an agent's metrics read its node's figures.
type NodeOptions struct {
	Node string
	// Store reads the store's figures. On a big store that takes a while:
	// a scrape calls it at most every StoreEvery (default 1 min), in the
	// background once there is a first figure, and is answered with the
	// figures last read meanwhile (cairn_store_stats_age_seconds).
	Store      func(ctx context.Context) (StoreStats, error)
	StoreEvery time.Duration
	// Staging and Data read the staging dir's and the data dir's file
	// systems at every scrape; Probes the health probes' last results
	// (nil: none run).
	Staging, Data func() (SpaceStats, error)
	Probes        func() []Probe
	// Certs gives when the agent's certificates expire (nil: not exposed).
	Certs CertExpiry
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// DefaultStoreEvery is NodeOptions.StoreEvery's default.
const DefaultStoreEvery = time.Minute

// Node is an agent's metrics: its node's store, staging and health.
type Node struct {
	opts NodeOptions
	reg  *prometheus.Registry
	defs []Def

	storeStored, storeRaw, storeLogical, storeChunks, storePacks, storeImages *prometheus.Desc
	storeDedup, storeCompression, storeQuarantined, storeAge                  *prometheus.Desc
	stagingUsed, stagingKept, stagingSize, stagingFree, dataSize, dataFree    *prometheus.Desc
	probe                                                                     *prometheus.Desc

	mu         sync.Mutex
	store      StoreStats
	storeAt    time.Time // when store was read; zero: never
	triedAt    time.Time // when the last read began, that failed or not
	refreshing bool
}

// NewNode returns an agent's metrics, with the Go runtime's and the
// process's.
func NewNode(opts NodeOptions) *Node {
	if opts.StoreEvery <= 0 {
		opts.StoreEvery = DefaultStoreEvery
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	n := &Node{opts: opts, reg: prometheus.NewRegistry()}
	n.storeStored = n.desc("cairn_store_stored_bytes", "Bytes the store's chunks take, compressed, each chunk once.")
	n.storeRaw = n.desc("cairn_store_raw_bytes", "Raw bytes of the store's distinct chunks.")
	n.storeLogical = n.desc("cairn_store_logical_bytes", "The sizes of the rank images in the store, as files, summed.")
	n.storeChunks = n.desc("cairn_store_chunks", "Distinct chunks in the store.")
	n.storePacks = n.desc("cairn_store_packs", "Packs in the store.")
	n.storeImages = n.desc("cairn_store_images", "Rank images in the store: the node's own and the copies it holds.")
	n.storeDedup = n.desc("cairn_store_dedup_ratio", "Logical bytes over raw bytes: what deduplication saves.")
	n.storeCompression = n.desc("cairn_store_compression_ratio", "Raw bytes over stored bytes: what compression saves.")
	n.storeQuarantined = n.desc("cairn_store_quarantined_packs", "Damaged packs the store set aside in its quarantine.")
	n.storeAge = n.desc("cairn_store_stats_age_seconds", "How old the store's figures are (they are read at most once a minute).")
	n.stagingUsed = n.desc("cairn_staging_used_bytes", "Bytes in the staging dir: images being dumped, restored or moved, and kept images.")
	n.stagingKept = n.desc("cairn_staging_kept_bytes", "Of the staging dir's bytes, the images kept after their checkpoint for a restore here.")
	n.stagingSize = n.desc("cairn_staging_size_bytes", "Size of the staging dir's file system.")
	n.stagingFree = n.desc("cairn_staging_free_bytes", "Free bytes of the staging dir's file system.")
	n.dataSize = n.desc("cairn_data_disk_size_bytes", "Size of the data dir's file system (containers and the store).")
	n.dataFree = n.desc("cairn_data_disk_free_bytes", "Free bytes of the data dir's file system.")
	n.probe = n.desc("cairn_health_probe_ok", "1 if the health probe passed its last run, 0 if it failed.", "probe")
	n.reg.MustRegister(nodeCollector{n},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if opts.Certs != nil {
		n.reg.MustRegister(newCertCollector(opts.Certs, prometheus.Labels{"node": opts.Node}))
		n.defs = append(n.defs, Def{certDef.Name, certDef.Type, certDef.Help, append([]string{"node"}, certDef.Labels...)})
	}
	return n
}

func (n *Node) desc(name, help string, labels ...string) *prometheus.Desc {
	n.defs = append(n.defs, Def{name, "gauge", help, append([]string{"node"}, labels...)})
	return prometheus.NewDesc(name, help, labels, prometheus.Labels{"node": n.opts.Node})
}

// Defs returns every family of cairn's in the agent's registry.
func (n *Node) Defs() []Def { return n.defs }

// Gather gathers the agent's registry.
func (n *Node) Gather() ([]*dto.MetricFamily, error) { return n.reg.Gather() }

// storeStats returns the store's figures and when they were read: read
// now if never yet, else as last read, with a new read started if they
// are due.
func (n *Node) storeStats() (StoreStats, time.Time) {
	n.mu.Lock()
	if n.opts.Store == nil {
		n.mu.Unlock()
		return StoreStats{}, time.Time{}
	}
	switch {
	case n.refreshing:
	case n.triedAt.IsZero():
		n.refreshing, n.triedAt = true, n.opts.Now()
		n.mu.Unlock()
		n.readStore()
		n.mu.Lock()
	case n.opts.Now().Sub(n.triedAt) >= n.opts.StoreEvery:
		n.refreshing, n.triedAt = true, n.opts.Now()
		go n.readStore()
	}
	defer n.mu.Unlock()
	return n.store, n.storeAt
}

func (n *Node) readStore() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st, err := n.opts.Store(ctx)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.refreshing = false
	if err == nil {
		n.store, n.storeAt = st, n.opts.Now()
	}
}

// nodeCollector collects a Node's figures at each scrape.
type nodeCollector struct{ n *Node }

func (c nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	n := c.n
	for _, d := range []*prometheus.Desc{n.storeStored, n.storeRaw, n.storeLogical, n.storeChunks, n.storePacks, n.storeImages,
		n.storeDedup, n.storeCompression, n.storeQuarantined, n.storeAge,
		n.stagingUsed, n.stagingKept, n.stagingSize, n.stagingFree, n.dataSize, n.dataFree, n.probe} {
		ch <- d
	}
}

func (c nodeCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.n
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if st, at := n.storeStats(); !at.IsZero() {
		gauge(n.storeStored, float64(st.Stored))
		gauge(n.storeRaw, float64(st.Raw))
		gauge(n.storeLogical, float64(st.Logical))
		gauge(n.storeChunks, float64(st.Chunks))
		gauge(n.storePacks, float64(st.Packs))
		gauge(n.storeImages, float64(st.Images))
		gauge(n.storeDedup, ratio(st.Logical, st.Raw))
		gauge(n.storeCompression, ratio(st.Raw, st.Stored))
		gauge(n.storeQuarantined, float64(st.Quarantined))
		gauge(n.storeAge, max(0, n.opts.Now().Sub(at).Seconds()))
	}
	if n.opts.Staging != nil {
		if s, err := n.opts.Staging(); err == nil {
			gauge(n.stagingUsed, float64(s.Used))
			gauge(n.stagingKept, float64(s.Kept))
			gauge(n.stagingSize, float64(s.Size))
			gauge(n.stagingFree, float64(s.Free))
		}
	}
	if n.opts.Data != nil {
		if s, err := n.opts.Data(); err == nil {
			gauge(n.dataSize, float64(s.Size))
			gauge(n.dataFree, float64(s.Free))
		}
	}
	if n.opts.Probes != nil {
		for _, p := range n.opts.Probes() {
			gauge(n.probe, b2f(p.OK), p.Name)
		}
	}
}

// ratio is a over b, 0 when b is.
func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
