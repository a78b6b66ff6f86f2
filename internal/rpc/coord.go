package rpc

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/pki"
)

// CoordServerName is the name in the coordinator's certificate.
const CoordServerName = "coordinator"

// CoordClient calls the leading coordinator among those it knows. Errors
// it returns are *coordv1.Error.
type CoordClient struct {
	rpc   *failover
	creds *pki.Credentials // also for the agents of a job's ranks
}

// NewCoordClient returns a client for the coordinators at addrs, one
// host:port or several separated by commas: it calls the one that
// answered last, and moves on to the next when one stands by or cannot be
// reached (see failover).
func NewCoordClient(addrs string, creds *pki.Credentials) *CoordClient {
	var cs []*Client
	for a := range strings.SplitSeq(addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			cs = append(cs, New(a, CoordServerName, creds, time.Hour))
		}
	}
	if len(cs) == 0 {
		cs = []*Client{New("", CoordServerName, creds, time.Hour)} // every call fails, saying so
	}
	return &CoordClient{&failover{clients: cs, wait: FailoverWait}, creds}
}

// Close releases idle connections.
func (c *CoordClient) Close() { c.rpc.Close() }

func jobPath(name, suffix string) string { return coordv1.PathJob + url.PathEscape(name) + suffix }

// Health asks who the coordinator is.
func (c *CoordClient) Health(ctx context.Context) (coordv1.Health, error) {
	var h coordv1.Health
	return h, c.rpc.Do(ctx, http.MethodGet, coordv1.PathHealth, nil, &h)
}

// Join registers the caller's node (agents only).
func (c *CoordClient) Join(ctx context.Context, j coordv1.Join) (coordv1.JoinReply, error) {
	var out coordv1.JoinReply
	return out, c.rpc.Do(ctx, http.MethodPost, coordv1.PathJoin, j, &out)
}

// Backup opens a backup of the catalog and the event history (clients
// only): a tar stream.
func (c *CoordClient) Backup(ctx context.Context) (io.ReadCloser, error) {
	return c.rpc.Stream(ctx, coordv1.PathBackup, nil)
}

// RenewCert asks for a renewal of the caller's certificate (agents only).
func (c *CoordClient) RenewCert(ctx context.Context, req coordv1.RenewCert) (coordv1.RenewCertReply, error) {
	var out coordv1.RenewCertReply
	return out, c.rpc.Do(ctx, http.MethodPost, coordv1.PathRenew, req, &out)
}

// Heartbeat keeps the caller's node alive (agents only).
func (c *CoordClient) Heartbeat(ctx context.Context, hb coordv1.Heartbeat) (coordv1.HeartbeatReply, error) {
	var out coordv1.HeartbeatReply
	return out, c.rpc.Do(ctx, http.MethodPost, coordv1.PathHeartbeat, hb, &out)
}

// Coordinators lists the cluster's coordinators, the leader among them.
func (c *CoordClient) Coordinators(ctx context.Context) ([]coordv1.Coordinator, error) {
	var out []coordv1.Coordinator
	return out, c.rpc.Do(ctx, http.MethodGet, coordv1.PathCoordinators, nil, &out)
}

// Nodes lists the cluster's nodes.
func (c *CoordClient) Nodes(ctx context.Context) ([]coordv1.Node, error) {
	var out []coordv1.Node
	return out, c.rpc.Do(ctx, http.MethodGet, coordv1.PathNodes, nil, &out)
}

// Jobs lists the jobs.
func (c *CoordClient) Jobs(ctx context.Context) ([]coordv1.Job, error) {
	var out []coordv1.Job
	return out, c.rpc.Do(ctx, http.MethodGet, coordv1.PathJobs, nil, &out)
}

// RunJob starts a job.
func (c *CoordClient) RunJob(ctx context.Context, req coordv1.RunJob) (coordv1.Job, error) {
	var out coordv1.Job
	return out, c.rpc.Do(ctx, http.MethodPost, coordv1.PathJobs, req, &out)
}

// Status returns a job with the live state of its ranks.
func (c *CoordClient) Status(ctx context.Context, name string) (coordv1.JobStatus, error) {
	var out coordv1.JobStatus
	return out, c.rpc.Do(ctx, http.MethodGet, jobPath(name, ""), nil, &out)
}

// RemoveJob removes a job; without force, only one that has no
// checkpoints and no running ranks.
func (c *CoordClient) RemoveJob(ctx context.Context, name string, force bool) (coordv1.Removed, error) {
	var out coordv1.Removed
	q := ""
	if force {
		q = "?force=1"
	}
	return out, c.rpc.Do(ctx, http.MethodDelete, jobPath(name, "")+q, nil, &out)
}

// KillJob sends sig (0: SIGKILL) to every rank of a job.
func (c *CoordClient) KillJob(ctx context.Context, name string, sig int) (coordv1.Job, error) {
	var out coordv1.Job
	return out, c.rpc.Do(ctx, http.MethodPost, jobPath(name, coordv1.SuffixKill), coordv1.Kill{Signal: sig}, &out)
}

// Checkpoint runs a global checkpoint round and returns its outcome. An
// aborted round returns the checkpoint record and an error of code
// aborted.
func (c *CoordClient) Checkpoint(ctx context.Context, name string, req coordv1.CheckpointJob) (coordv1.Ckpt, error) {
	var out coordv1.Ckpt
	return out, c.rpc.Do(ctx, http.MethodPost, jobPath(name, coordv1.SuffixCheckpoint), req, &out)
}

// Flush flushes a job's checkpoint to the durable tier and returns it once
// flushed.
func (c *CoordClient) Flush(ctx context.Context, name string, req coordv1.Flush) (coordv1.Ckpt, error) {
	var out coordv1.Ckpt
	return out, c.rpc.Do(ctx, http.MethodPost, jobPath(name, coordv1.SuffixFlush), req, &out)
}

// RemoveCkpt removes checkpoint seq of a job from the catalog and its
// rank images from every live node.
func (c *CoordClient) RemoveCkpt(ctx context.Context, name string, seq int) (coordv1.CkptRemoved, error) {
	var out coordv1.CkptRemoved
	return out, c.rpc.Do(ctx, http.MethodDelete, jobPath(name, coordv1.SuffixCheckpoints+"/"+strconv.Itoa(seq)), nil, &out)
}

// PinCkpt pins checkpoint seq of a job, or unpins it.
func (c *CoordClient) PinCkpt(ctx context.Context, name string, seq int, pinned bool) (coordv1.Ckpt, error) {
	var out coordv1.Ckpt
	return out, c.rpc.Do(ctx, http.MethodPost, jobPath(name, coordv1.SuffixCheckpoints+"/"+strconv.Itoa(seq)+coordv1.SuffixPin), coordv1.Pin{Pinned: pinned}, &out)
}

// Checkpoints lists a job's checkpoints.
func (c *CoordClient) Checkpoints(ctx context.Context, name string) ([]coordv1.Ckpt, error) {
	var out []coordv1.Ckpt
	return out, c.rpc.Do(ctx, http.MethodGet, jobPath(name, coordv1.SuffixCheckpoints), nil, &out)
}

// Restart restarts a job from a checkpoint.
func (c *CoordClient) Restart(ctx context.Context, name string, req coordv1.Restart) (coordv1.Job, error) {
	var out coordv1.Job
	return out, c.rpc.Do(ctx, http.MethodPost, jobPath(name, coordv1.SuffixRestart), req, &out)
}

// SetSpare marks a node as a spare or not.
func (c *CoordClient) SetSpare(ctx context.Context, node string, spare bool) (coordv1.Node, error) {
	var out coordv1.Node
	return out, c.rpc.Do(ctx, http.MethodPost, coordv1.PathNode+url.PathEscape(node)+coordv1.SuffixSpare, coordv1.Spare{Spare: spare}, &out)
}

// EventsQuery selects events: after an event number, since a time, of a
// job, of types matching a pattern; Follow keeps the stream open for new
// ones.
type EventsQuery struct {
	After  uint64
	Since  time.Time
	Job    string
	Type   string
	Follow bool
}

// Events opens the event stream: one JSON api/events/coordv1.Event per line.
func (c *CoordClient) Events(ctx context.Context, q EventsQuery) (io.ReadCloser, error) {
	v := url.Values{}
	if q.After > 0 {
		v.Set("after", strconv.FormatUint(q.After, 10))
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if q.Job != "" {
		v.Set("job", q.Job)
	}
	if q.Type != "" {
		v.Set("type", q.Type)
	}
	if q.Follow {
		v.Set("follow", "1")
	}
	return c.rpc.Stream(ctx, coordv1.PathEvents+"?"+v.Encode(), nil)
}

// Migrate moves a rank of a job to another node (req.To empty: the
// coordinator's choice) and returns once the migration has ended.
func (c *CoordClient) Migrate(ctx context.Context, job string, req coordv1.Migrate) (coordv1.Migration, error) {
	var out coordv1.Migration
	return out, c.rpc.Do(ctx, http.MethodPost, jobPath(job, coordv1.SuffixMigrate), req, &out)
}

// Migrations lists a job's migrations.
func (c *CoordClient) Migrations(ctx context.Context, job string) ([]coordv1.Migration, error) {
	var out []coordv1.Migration
	return out, c.rpc.Do(ctx, http.MethodGet, jobPath(job, coordv1.SuffixMigrations), nil, &out)
}

// Drain moves every rank off a node and keeps new ones away; with
// undrain, lets them come again.
func (c *CoordClient) Drain(ctx context.Context, node string, req coordv1.Drain) (coordv1.DrainResult, error) {
	var out coordv1.DrainResult
	return out, c.rpc.Do(ctx, http.MethodPost, coordv1.PathNode+url.PathEscape(node)+coordv1.SuffixDrain, req, &out)
}

// RankCheckpoint takes a global checkpoint of a job one of this agent's
// ranks asked for, and returns it once the round has ended.
func (c *CoordClient) RankCheckpoint(ctx context.Context, req coordv1.RankRequest) (coordv1.Ckpt, error) {
	var out coordv1.Ckpt
	err := c.rpc.Do(ctx, http.MethodPost, coordv1.PathRankCheckpoint, req, &out)
	return out, err
}

// RankInfo tells a rank of this agent about its job.
func (c *CoordClient) RankInfo(ctx context.Context, req coordv1.RankRequest) (coordv1.RankInfo, error) {
	var out coordv1.RankInfo
	err := c.rpc.Do(ctx, http.MethodPost, coordv1.PathRankInfo, req, &out)
	return out, err
}

// RankEvent publishes an event of one of this agent's ranks.
func (c *CoordClient) RankEvent(ctx context.Context, req coordv1.RankRequest) error {
	return c.rpc.Do(ctx, http.MethodPost, coordv1.PathRankEvent, req, nil)
}
