package metrics_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/metrics"
)

// TestNode: an agent's figures, with the store's read once, then at most
// every StoreEvery in the background while the scrapes get the figures
// last read.
func TestNode(t *testing.T) {
	clk := &clock{now: t0}
	var mu sync.Mutex
	reads, fail := 0, false
	store := metrics.StoreStats{Stored: 250, Raw: 500, Logical: 2000, Chunks: 10, Packs: 2, Images: 4, Quarantined: 1}
	read := make(chan struct{}, 10)
	n := metrics.NewNode(metrics.NodeOptions{
		Node: "n1",
		Store: func(context.Context) (metrics.StoreStats, error) {
			mu.Lock()
			defer mu.Unlock()
			defer func() { read <- struct{}{} }()
			reads++
			if fail {
				return metrics.StoreStats{}, errors.New("store away")
			}
			return store, nil
		},
		StoreEvery: time.Minute,
		Staging: func() (metrics.SpaceStats, error) {
			return metrics.SpaceStats{Size: 1000, Free: 600, Used: 300, Kept: 100}, nil
		},
		Data:   func() (metrics.SpaceStats, error) { return metrics.SpaceStats{Size: 5000, Free: 4000}, nil },
		Probes: func() []metrics.Probe { return []metrics.Probe{{Name: "disk", OK: true}, {Name: "command", OK: false}} },
		Now:    clk.Now,
	})
	got := series(t, n)
	want(t, got, map[string]float64{
		`cairn_store_stored_bytes{node="n1"}`:              250,
		`cairn_store_raw_bytes{node="n1"}`:                 500,
		`cairn_store_logical_bytes{node="n1"}`:             2000,
		`cairn_store_chunks{node="n1"}`:                    10,
		`cairn_store_packs{node="n1"}`:                     2,
		`cairn_store_images{node="n1"}`:                    4,
		`cairn_store_dedup_ratio{node="n1"}`:               4,
		`cairn_store_compression_ratio{node="n1"}`:         2,
		`cairn_store_quarantined_packs{node="n1"}`:         1,
		`cairn_store_stats_age_seconds{node="n1"}`:         0,
		`cairn_staging_used_bytes{node="n1"}`:              300,
		`cairn_staging_kept_bytes{node="n1"}`:              100,
		`cairn_staging_size_bytes{node="n1"}`:              1000,
		`cairn_staging_free_bytes{node="n1"}`:              600,
		`cairn_data_disk_size_bytes{node="n1"}`:            5000,
		`cairn_data_disk_free_bytes{node="n1"}`:            4000,
		`cairn_health_probe_ok{node="n1",probe="disk"}`:    1,
		`cairn_health_probe_ok{node="n1",probe="command"}`: 0,
	})
	if _, ok := got["go_goroutines"]; !ok {
		t.Error("no Go runtime metrics")
	}
	lint(t, n)
	<-read

	// Within StoreEvery: the figures as read.
	clk.Add(30 * time.Second)
	mu.Lock()
	store.Images = 5
	mu.Unlock()
	want(t, series(t, n), map[string]float64{`cairn_store_images{node="n1"}`: 4, `cairn_store_stats_age_seconds{node="n1"}`: 30})
	// Past it: read again in the background; this scrape gets the old
	// figures, a later one the new.
	clk.Add(time.Minute)
	want(t, series(t, n), map[string]float64{`cairn_store_images{node="n1"}`: 4})
	<-read
	want(t, series(t, n), map[string]float64{`cairn_store_images{node="n1"}`: 5, `cairn_store_stats_age_seconds{node="n1"}`: 0})
	// A read that fails keeps the figures, and they age.
	mu.Lock()
	fail = true
	mu.Unlock()
	clk.Add(2 * time.Minute)
	series(t, n)
	<-read
	want(t, series(t, n), map[string]float64{`cairn_store_images{node="n1"}`: 5, `cairn_store_stats_age_seconds{node="n1"}`: 120})
	mu.Lock()
	defer mu.Unlock()
	if reads != 3 {
		t.Errorf("the store was read %d times, want 3", reads)
	}
}

// TestNodeWithout: an agent without a store, staging or probes exports
// none of their series.
func TestNodeWithout(t *testing.T) {
	n := metrics.NewNode(metrics.NodeOptions{Node: "n1"})
	for k := range series(t, n) {
		if len(k) > 6 && k[:6] == "cairn_" {
			t.Errorf("series %s", k)
		}
	}
}
