package agent

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/metrics"
	"github.com/cairn-hpc/cairn/internal/pki"
)

// newMetrics returns the metrics of this node: its store, staging, data
// disk, its credentials' expiry, and the health probes of h (nil: none
// run).
func newMetrics(creds *pki.Credentials, m *container.Manager, h *Health) *metrics.Node {
	opts := metrics.NodeOptions{
		Node:  creds.Name,
		Certs: func() (time.Time, time.Time) { return creds.Cert().NotAfter, creds.CA.NotAfter },
		Store: func(ctx context.Context) (metrics.StoreStats, error) { return storeStats(m.Repo()) },
		Staging: func() (metrics.SpaceStats, error) {
			s, err := space(m.StagingDir())
			s.Used, s.Kept = m.StagingUsage()
			return s, err
		},
		Data: func() (metrics.SpaceStats, error) { return space(m.DataDir()) },
	}
	if h != nil {
		opts.Probes = h.probes
	}
	return metrics.NewNode(opts)
}

// storeStats reads the figures of the node's store: its index's totals,
// and its records. It loads the index; metrics.Node calls it at most once
// a minute.
func storeStats(repo image.Repo) (metrics.StoreStats, error) {
	var out metrics.StoreStats
	recs, _ := repo.All() // an unreadable record is verify's to report
	for _, r := range recs {
		out.Images++
		out.Logical += r.Logical
	}
	st, err := repo.OpenReader()
	if errors.Is(err, image.ErrNotFound) {
		return out, nil // no store yet
	}
	if err != nil {
		return out, err
	}
	defer st.Close()
	s := st.Stats()
	out.Stored, out.Raw, out.Chunks, out.Packs = s.StoredBytes, s.RawBytes, s.Chunks, s.Packs
	q, err := repo.Quarantined()
	out.Quarantined = len(q)
	return out, err
}

// space reads the size and free bytes of dir's file system: that of its
// nearest existing parent while dir is yet to be made (staging is, until
// the first dump).
func space(dir string) (metrics.SpaceStats, error) {
	var st unix.Statfs_t
	for {
		err := unix.Statfs(dir, &st)
		if err == nil {
			return metrics.SpaceStats{Size: st.Blocks * uint64(st.Bsize), Free: st.Bavail * uint64(st.Bsize)}, nil
		}
		parent := filepath.Dir(dir)
		if !errors.Is(err, unix.ENOENT) || parent == dir {
			return metrics.SpaceStats{}, err
		}
		dir = parent
	}
}

// probes are the health probes that run, each passing unless its last run
// failed.
func (h *Health) probes() []metrics.Probe {
	var names []string
	if h.cfg.MinFreeDisk > 0 && h.cfg.DataDir != "" {
		names = append(names, "disk")
	}
	if h.cfg.MinFreeMemory > 0 {
		names = append(names, "memory")
	}
	if h.cfg.Command != "" {
		names = append(names, "command")
	}
	failing := h.Warnings()
	out := make([]metrics.Probe, len(names))
	for i, n := range names {
		out[i] = metrics.Probe{Name: n, OK: true}
		for _, w := range failing {
			if strings.HasPrefix(w, n+":") {
				out[i].OK = false
			}
		}
	}
	return out
}

// serveMetrics serves the node's metrics.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if s.Metrics == nil {
		fail(w, http.StatusNotFound, agentv1.CodeNotFound, "this agent serves no metrics")
		return
	}
	s.scrape.ServeHTTP(w, r)
}
