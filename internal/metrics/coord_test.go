package metrics_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/metrics"
)

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// ringCkpt is the record of checkpoint seq of a two-rank job "ring".
func ringCkpt(seq int, new0, new1 int64) coordv1.Ckpt {
	return coordv1.Ckpt{Job: "ring", Seq: seq, State: coordv1.CkptDurable,
		Stall: 2 * time.Second, Coord: 500 * time.Millisecond, Cont: 100 * time.Millisecond, MaxDump: 1500 * time.Millisecond,
		Ingest: 3 * time.Second, Bytes: 1000,
		Ranks: []coordv1.CkptRank{
			{Rank: 0, Node: "n1", Size: 600, NewBytes: new0, Dump: 1500 * time.Millisecond, CRIU: time.Second, Ingest: 3 * time.Second},
			{Rank: 1, Node: "n2", Size: 400, NewBytes: new1, Dump: 1200 * time.Millisecond, CRIU: 800 * time.Millisecond, Ingest: 2 * time.Second},
		}}
}

func rank(r int) *int { return &r }

// TestCoordFromEvents: counters, histograms and gauges follow the events
// and records of a job's life, and the lag counts from the oldest durable
// checkpoint that waits for its copies.
func TestCoordFromEvents(t *testing.T) {
	clk := &clock{now: t0}
	m := metrics.NewCoord(metrics.CoordOptions{Now: clk.Now})
	ev := func(e evv1.Event) { m.Event(e, true) }

	ev(evv1.Event{Type: evv1.JobStarted, Job: "ring", Time: t0})
	ev(evv1.Event{Type: evv1.CkptDurable, Job: "ring", Ckpt: 1, Time: t0.Add(time.Second), Duration: 2 * time.Second, Bytes: 1000})
	m.Checkpoint(ringCkpt(1, 600, 400), true)
	ev(evv1.Event{Type: evv1.ReplicaCopied, Job: "ring", Ckpt: 1, Rank: rank(0), Node: "n2", Peer: "n1", Bytes: 600, Duration: time.Second})
	ev(evv1.Event{Type: evv1.ReplicaCopied, Job: "ring", Ckpt: 1, Rank: rank(1), Node: "n3", Peer: "n2", Bytes: 400, Duration: 2 * time.Second})
	ev(evv1.Event{Type: evv1.CkptProtected, Job: "ring", Ckpt: 1, Time: t0.Add(10 * time.Second)})
	ev(evv1.Event{Type: evv1.CkptDurable, Job: "ring", Ckpt: 2, Time: t0.Add(30 * time.Second), Duration: time.Second, Bytes: 1100})
	ck2 := ringCkpt(2, 50, 10)
	ck2.Stall, ck2.Ranks[0].Size = time.Second, 700
	m.Checkpoint(ck2, true)
	ev(evv1.Event{Type: evv1.CkptAborted, Job: "ring", Ckpt: 3, Message: "deadline exceeded"})
	ev(evv1.Event{Type: evv1.CkptAborted, Job: "ring", Ckpt: 4, Message: "rank 1 lost: node n2 lost"})
	ev(evv1.Event{Type: evv1.ReplicaFailed, Job: "ring", Ckpt: 2, Rank: rank(1), Node: "n3"})
	ev(evv1.Event{Type: evv1.NodeLost, Node: "n2"})
	ev(evv1.Event{Type: evv1.JobRestarting, Job: "ring", Ckpt: 2})
	ev(evv1.Event{Type: evv1.JobRestarted, Job: "ring", Ckpt: 2, Duration: 5 * time.Second})
	ev(evv1.Event{Type: evv1.MigrationDone, Job: "ring", Ckpt: 5, Rank: rank(0), Duration: 3 * time.Second, Bytes: 700})
	m.Migration(coordv1.Migration{Job: "ring", Seq: 5, State: coordv1.MigrationDone, Dump: time.Second, Move: 500 * time.Millisecond, Restore: 250 * time.Millisecond, Resume: 100 * time.Millisecond})
	ev(evv1.Event{Type: evv1.MigrationFailed, Job: "ring", Ckpt: 6, Rank: rank(1)})
	m.Migration(coordv1.Migration{Job: "ring", Seq: 6, State: coordv1.MigrationFailed, Dump: time.Second})
	ev(evv1.Event{Type: evv1.HealthWarning, Node: "n1", Message: "disk: 1% free"})
	clk.Add(time.Minute)

	got := series(t, m)
	want(t, got, map[string]float64{
		`cairn_events_total{type="checkpoint.durable"}`:                       2,
		`cairn_events_total{type="replica.copied"}`:                           2,
		`cairn_checkpoints_durable_total{job_name="ring"}`:                    2,
		`cairn_checkpoints_protected_total{job_name="ring"}`:                  1,
		`cairn_checkpoint_aborts_total{job_name="ring",reason="deadline"}`:    1,
		`cairn_checkpoint_aborts_total{job_name="ring",reason="rank_lost"}`:   1,
		`cairn_checkpoint_stall_seconds_count{job_name="ring"}`:               2,
		`cairn_checkpoint_stall_seconds_sum{job_name="ring"}`:                 3,
		`cairn_checkpoint_coord_seconds_sum{job_name="ring"}`:                 1,
		`cairn_checkpoint_cont_seconds_sum{job_name="ring"}`:                  0.2,
		`cairn_checkpoint_dump_seconds_sum{job_name="ring"}`:                  3,
		`cairn_checkpoint_ingest_seconds_sum{job_name="ring"}`:                6,
		`cairn_checkpoint_image_bytes_total{job_name="ring"}`:                 2100,
		`cairn_checkpoint_new_bytes_total{job_name="ring"}`:                   1060,
		`cairn_checkpoint_last_image_bytes{job_name="ring"}`:                  1100,
		`cairn_checkpoint_last_new_bytes{job_name="ring"}`:                    60,
		`cairn_checkpoint_last_stall_seconds{job_name="ring"}`:                1,
		`cairn_checkpoint_last_durable_number{job_name="ring"}`:               2,
		`cairn_checkpoint_last_durable_timestamp_seconds{job_name="ring"}`:    float64(t0.Unix() + 30),
		`cairn_checkpoint_last_protected_number{job_name="ring"}`:             1,
		`cairn_checkpoint_last_protected_timestamp_seconds{job_name="ring"}`:  float64(t0.Unix() + 10),
		`cairn_rank_checkpoint_image_bytes{job_name="ring",rank="0"}`:         700,
		`cairn_rank_checkpoint_image_bytes{job_name="ring",rank="1"}`:         400,
		`cairn_rank_checkpoint_new_bytes{job_name="ring",rank="0"}`:           50,
		`cairn_rank_checkpoint_new_bytes{job_name="ring",rank="1"}`:           10,
		`cairn_rank_checkpoint_dump_seconds{job_name="ring",rank="1"}`:        1.2,
		`cairn_rank_checkpoint_criu_seconds{job_name="ring",rank="1"}`:        0.8,
		`cairn_rank_checkpoint_ingest_seconds{job_name="ring",rank="0"}`:      3,
		`cairn_replica_copies_total{job_name="ring"}`:                         2,
		`cairn_replica_copied_bytes_total{job_name="ring"}`:                   1000,
		`cairn_replica_copy_seconds_sum{job_name="ring"}`:                     3,
		`cairn_replica_failures_total{job_name="ring"}`:                       1,
		`cairn_replication_pending_checkpoints{job_name="ring"}`:              1,
		`cairn_replication_lag_seconds{job_name="ring"}`:                      30, // checkpoint 2, durable at +30 s, now +60 s
		`cairn_job_restarts_total{job_name="ring"}`:                           1,
		`cairn_job_restart_seconds_sum{job_name="ring"}`:                      5,
		`cairn_migrations_total{job_name="ring",result="done"}`:               1,
		`cairn_migrations_total{job_name="ring",result="failed"}`:             1,
		`cairn_migration_stall_seconds_count{job_name="ring"}`:                1,
		`cairn_migration_moved_bytes_total{job_name="ring"}`:                  700,
		`cairn_migration_phase_seconds_sum{job_name="ring",phase="dump"}`:     1,
		`cairn_migration_phase_seconds_sum{job_name="ring",phase="move"}`:     0.5,
		`cairn_migration_phase_seconds_sum{job_name="ring",phase="restore"}`:  0.25,
		`cairn_migration_phase_seconds_count{job_name="ring",phase="resume"}`: 1,
		`cairn_node_lost_total{node="n2"}`:                                    1,
		`cairn_node_alive{node="n2"}`:                                         0,
		`cairn_node_health_warnings_total{node="n1"}`:                         1,
	})
	lint(t, m)

	// Checkpoint 2 protected: nothing waits.
	ev(evv1.Event{Type: evv1.CkptProtected, Job: "ring", Ckpt: 2, Time: clk.Now()})
	want(t, series(t, m), map[string]float64{
		`cairn_replication_pending_checkpoints{job_name="ring"}`:             0,
		`cairn_replication_lag_seconds{job_name="ring"}`:                     0,
		`cairn_checkpoint_last_protected_number{job_name="ring"}`:            2,
		`cairn_checkpoint_last_protected_timestamp_seconds{job_name="ring"}`: float64(clk.Now().Unix()),
	})
	// A copy repaired later protects checkpoint 1 again: it is counted,
	// and the newest protected checkpoint stays 2.
	ev(evv1.Event{Type: evv1.CkptProtected, Job: "ring", Ckpt: 1, Time: clk.Now().Add(time.Hour)})
	want(t, series(t, m), map[string]float64{
		`cairn_checkpoints_protected_total{job_name="ring"}`:                 3,
		`cairn_checkpoint_last_protected_number{job_name="ring"}`:            2,
		`cairn_checkpoint_last_protected_timestamp_seconds{job_name="ring"}`: float64(clk.Now().Unix()),
	})
}

// TestCoordReplay: the history a restarted coordinator replays sets the
// gauges of the newest checkpoints and counts nothing; what comes live
// after it counts.
func TestCoordReplay(t *testing.T) {
	clk := &clock{now: t0}
	m := metrics.NewCoord(metrics.CoordOptions{Now: clk.Now})
	for _, e := range []evv1.Event{
		{Type: evv1.CkptDurable, Job: "ring", Ckpt: 1, Time: t0, Duration: time.Second, Bytes: 1000},
		{Type: evv1.CkptProtected, Job: "ring", Ckpt: 1, Time: t0.Add(time.Second)},
		{Type: evv1.CkptDurable, Job: "ring", Ckpt: 2, Time: t0.Add(time.Minute), Duration: time.Second, Bytes: 900},
		{Type: evv1.JobRestarted, Job: "ring", Duration: time.Second},
		{Type: evv1.CkptAborted, Job: "ring", Ckpt: 3, Message: "deadline exceeded"},
	} {
		m.Event(e, false)
	}
	m.Checkpoint(ringCkpt(2, 5, 6), false)
	clk.Add(2 * time.Minute)
	got := series(t, m)
	want(t, got, map[string]float64{
		`cairn_checkpoint_last_durable_number{job_name="ring"}`:              2,
		`cairn_checkpoint_last_durable_timestamp_seconds{job_name="ring"}`:   float64(t0.Unix() + 60),
		`cairn_checkpoint_last_image_bytes{job_name="ring"}`:                 900,
		`cairn_checkpoint_last_protected_number{job_name="ring"}`:            1,
		`cairn_checkpoint_last_protected_timestamp_seconds{job_name="ring"}`: float64(t0.Unix() + 1),
		`cairn_rank_checkpoint_new_bytes{job_name="ring",rank="1"}`:          6,
		`cairn_replication_lag_seconds{job_name="ring"}`:                     60,
	},
		`cairn_checkpoints_durable_total{job_name="ring"}`,
		`cairn_checkpoint_stall_seconds_count{job_name="ring"}`,
		`cairn_job_restarts_total{job_name="ring"}`,
		`cairn_checkpoint_aborts_total{job_name="ring",reason="deadline"}`,
		`cairn_events_total{type="checkpoint.durable"}`)
	// An older checkpoint's record read back does not replace the newest's.
	m.Checkpoint(ringCkpt(1, 500, 600), false)
	want(t, series(t, m), map[string]float64{`cairn_rank_checkpoint_new_bytes{job_name="ring",rank="1"}`: 6})
}

// fakeCatalog serves jobs and nodes; during may publish meanwhile.
type fakeCatalog struct {
	mu     sync.Mutex
	jobs   []coordv1.Job
	nodes  []coordv1.Node
	err    error
	during func()
	reads  int
}

func (f *fakeCatalog) Jobs(context.Context) ([]coordv1.Job, error) {
	f.mu.Lock()
	jobs, err, during := slices.Clone(f.jobs), f.err, f.during
	f.reads++
	f.mu.Unlock()
	if during != nil {
		during()
	}
	return jobs, err
}

func (f *fakeCatalog) Nodes(context.Context) ([]coordv1.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.nodes), f.err
}

// TestCoordSnapshot: the jobs' and nodes' gauges come from the catalog,
// read at most once a second; a job or node gone from it loses its
// series, but one that came while the catalog was read keeps them.
func TestCoordSnapshot(t *testing.T) {
	clk := &clock{now: t0}
	m := metrics.NewCoord(metrics.CoordOptions{Now: clk.Now})
	ring := coordv1.Job{RunJob: coordv1.RunJob{Name: "ring", Ranks: 3, Replicas: 1, CheckpointEvery: time.Minute}, State: coordv1.JobRunning}
	solo := coordv1.Job{RunJob: coordv1.RunJob{Name: "solo", Ranks: 1}, State: coordv1.JobKilled}
	cat := &fakeCatalog{jobs: []coordv1.Job{ring, solo}, nodes: []coordv1.Node{
		{Name: "n1", Alive: true, Ranks: 2},
		{Name: "n2", Alive: false, Health: []string{"disk: 1% free"}, Quarantined: []string{"p1", "p2"}, Spare: true, Drained: true},
	}}
	m.SetCatalog(cat)
	m.Event(evv1.Event{Type: evv1.CkptDurable, Job: "ring", Ckpt: 1, Time: t0, Bytes: 10}, true)
	m.Event(evv1.Event{Type: evv1.CkptDurable, Job: "solo", Ckpt: 1, Time: t0, Bytes: 10}, true)
	got := series(t, m)
	want(t, got, map[string]float64{
		`cairn_jobs{state="running"}`:                                      1,
		`cairn_jobs{state="killed"}`:                                       1,
		`cairn_jobs{state="lost"}`:                                         0,
		`cairn_job_state{job_name="ring",state="running"}`:                 1,
		`cairn_job_state{job_name="ring",state="failed"}`:                  0,
		`cairn_job_state{job_name="solo",state="killed"}`:                  1,
		`cairn_job_ranks{job_name="ring"}`:                                 3,
		`cairn_job_replicas{job_name="ring"}`:                              1,
		`cairn_job_checkpoint_interval_seconds{job_name="ring"}`:           60,
		`cairn_job_checkpoint_interval_seconds{job_name="solo"}`:           0,
		`cairn_node_alive{node="n1"}`:                                      1,
		`cairn_node_alive{node="n2"}`:                                      0,
		`cairn_node_healthy{node="n1"}`:                                    1,
		`cairn_node_healthy{node="n2"}`:                                    0,
		`cairn_node_ranks{node="n1"}`:                                      2,
		`cairn_node_spare{node="n2"}`:                                      1,
		`cairn_node_drained{node="n2"}`:                                    1,
		`cairn_node_quarantined_packs{node="n2"}`:                          2,
		`cairn_checkpoints_durable_total{job_name="solo"}`:                 1,
		`cairn_checkpoint_last_durable_timestamp_seconds{job_name="solo"}`: float64(t0.Unix()),
	})
	lint(t, m)

	// Within a second, the catalog is not read again.
	series(t, m)
	if cat.reads != 1 {
		t.Fatalf("%d catalog reads within a second, want 1", cat.reads)
	}

	// solo and n2 are removed; "late" starts while the catalog is read.
	cat.mu.Lock()
	cat.jobs, cat.nodes = []coordv1.Job{ring}, cat.nodes[:1]
	cat.during = func() {
		clk.Add(time.Millisecond)
		m.Event(evv1.Event{Type: evv1.CkptDurable, Job: "late", Ckpt: 1, Time: clk.Now(), Bytes: 7}, true)
	}
	cat.mu.Unlock()
	clk.Add(time.Second)
	got = series(t, m)
	want(t, got, map[string]float64{
		`cairn_jobs{state="killed"}`:                          0,
		`cairn_checkpoints_durable_total{job_name="ring"}`:    1,
		`cairn_checkpoint_image_bytes_total{job_name="late"}`: 7,
	},
		`cairn_checkpoints_durable_total{job_name="solo"}`,
		`cairn_job_state{job_name="solo",state="killed"}`,
		`cairn_checkpoint_last_durable_timestamp_seconds{job_name="solo"}`,
		`cairn_replication_lag_seconds{job_name="solo"}`,
		`cairn_node_alive{node="n2"}`,
		`cairn_node_quarantined_packs{node="n2"}`)

	// A catalog that cannot be read leaves the gauges as they were.
	cat.mu.Lock()
	cat.err, cat.during = errors.New("etcd away"), nil
	cat.mu.Unlock()
	clk.Add(time.Second)
	want(t, series(t, m), map[string]float64{`cairn_job_ranks{job_name="ring"}`: 3, `cairn_node_alive{node="n1"}`: 1})
}

// TestAbortReason: the reasons rounds abort with, as the round and the
// coordinator word them, sort into a few.
func TestAbortReason(t *testing.T) {
	for _, tc := range []struct{ msg, want string }{
		{"deadline exceeded", "deadline"},
		{"deadline passed before start", "deadline"},
		{"coordinator restarted before the decision", "coordinator_restart"},
		{"rank 2 lost: node n3 lost", "rank_lost"},
		{"rank 0 lost: Post \"https://10.0.0.2:7420/v1/ckpt/prepare\": EOF", "rank_lost"},
		{"rank 1 failed: container ring.1 is not running", "rank_failed"},
		{"rank 1 failed: checkpoint ring.1: dump timed out after 10m0s", "dump_timeout"},
		{"rank 3 failed: container processes damaged by an interrupted dump", "rank_damaged"},
		{"something else", "other"},
		{"", "other"},
	} {
		if got := metrics.AbortReason(tc.msg); got != tc.want {
			t.Errorf("AbortReason(%q) = %s, want %s", tc.msg, got, tc.want)
		}
		if !slices.Contains(metrics.AbortReasons, tc.want) {
			t.Errorf("%s is not in AbortReasons", tc.want)
		}
	}
}
