package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	v1 "cairn/api/agent/v1"
	"cairn/internal/pki"
	"cairn/internal/rpc"
)

// Client calls one agent. Errors the agent returns are *v1.Error.
type Client struct{ rpc *rpc.Client }

// NewClient returns a client for the agent at addr (host:port) whose
// certificate names serverName, authenticating with creds.
func NewClient(addr, serverName string, creds *pki.Credentials) *Client {
	return &Client{rpc.New(addr, serverName, creds, 10*time.Minute)}
}

// Close releases idle connections.
func (c *Client) Close() { c.rpc.Close() }

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	return c.rpc.Do(ctx, method, path, body, out)
}

func (c *Client) stream(ctx context.Context, path string) (io.ReadCloser, error) {
	return c.rpc.Stream(ctx, path, nil)
}

// Chunks lists the chunk ids of a checkpoint image on the agent.
func (c *Client) Chunks(ctx context.Context, container string, seq int) ([]string, error) {
	var out v1.Chunks
	err := c.do(ctx, http.MethodGet, fmt.Sprintf("%s?container=%s&seq=%d", v1.PathChunks, url.QueryEscape(container), seq), nil, &out)
	return out.IDs, err
}

// ExportDelta opens a delta export stream of a checkpoint image holding
// only the given chunks.
func (c *Client) ExportDelta(ctx context.Context, req v1.ExportDelta) (io.ReadCloser, error) {
	return c.rpc.Stream(ctx, v1.PathExportDelta, req)
}

// ChunkData opens a chunk stream of the given chunks of a checkpoint
// image.
func (c *Client) ChunkData(ctx context.Context, req v1.ChunkData) (io.ReadCloser, error) {
	return c.rpc.Stream(ctx, v1.PathChunkData, req)
}

// JobNet ensures a job's network on the agent's node.
func (c *Client) JobNet(ctx context.Context, req v1.JobNet) error {
	return c.do(ctx, http.MethodPut, v1.PathJobNet, req, nil)
}

// DeleteJobNet removes a job's network devices from the agent's node.
func (c *Client) DeleteJobNet(ctx context.Context, vni uint32) error {
	return c.do(ctx, http.MethodDelete, fmt.Sprintf("%s?vni=%d", v1.PathJobNet, vni), nil, nil)
}

// RankRun starts a rank.
func (c *Client) RankRun(ctx context.Context, req v1.RankRun) (v1.Container, error) {
	var out v1.Container
	return out, c.do(ctx, http.MethodPost, v1.PathRankRun, req, &out)
}

// RankRestore restores a rank frozen, with its network locked.
func (c *Client) RankRestore(ctx context.Context, req v1.RankRestore) (v1.Container, error) {
	var out v1.Container
	return out, c.do(ctx, http.MethodPost, v1.PathRankRestore, req, &out)
}

// RankResume unlocks and thaws restored ranks.
func (c *Client) RankResume(ctx context.Context, req v1.RankResume) error {
	return c.do(ctx, http.MethodPost, v1.PathRankResume, req, nil)
}

// RankRemove removes a rank's container and network.
func (c *Client) RankRemove(ctx context.Context, req v1.RankRemove) error {
	return c.do(ctx, http.MethodPost, v1.PathRankRemove, req, nil)
}

// Prepare runs phase one of a global checkpoint for a rank.
func (c *Client) Prepare(ctx context.Context, req v1.Prepare) (v1.Prepared, error) {
	var out v1.Prepared
	return out, c.do(ctx, http.MethodPost, v1.PathPrepare, req, &out)
}

// Commit commits a prepared rank and returns once its image is durable.
func (c *Client) Commit(ctx context.Context, req v1.Finish) (v1.Committed, error) {
	var out v1.Committed
	return out, c.do(ctx, http.MethodPost, v1.PathCommit, req, &out)
}

// Abort aborts a prepared rank.
func (c *Client) Abort(ctx context.Context, req v1.Finish) error {
	return c.do(ctx, http.MethodPost, v1.PathAbort, req, nil)
}

// Fetch has the agent copy an image from another agent.
func (c *Client) Fetch(ctx context.Context, req v1.Fetch) (v1.Image, error) {
	var out v1.Image
	return out, c.do(ctx, http.MethodPost, v1.PathFetch, req, &out)
}

// Kill sends a signal to a container's processes.
func (c *Client) Kill(ctx context.Context, name string, sig int) error {
	return c.do(ctx, http.MethodPost, fmt.Sprintf("%s%s?signal=%d", v1.PathKill, url.PathEscape(name), sig), nil, nil)
}

// Health asks who the agent is.
func (c *Client) Health(ctx context.Context) (v1.Health, error) {
	var h v1.Health
	return h, c.do(ctx, http.MethodGet, v1.PathHealth, nil, &h)
}

// List returns the agent's containers.
func (c *Client) List(ctx context.Context) ([]v1.Container, error) {
	var out []v1.Container
	return out, c.do(ctx, http.MethodGet, v1.PathContainers, nil, &out)
}

// Run starts a container.
func (c *Client) Run(ctx context.Context, req v1.RunRequest) (v1.Container, error) {
	var out v1.Container
	return out, c.do(ctx, http.MethodPost, v1.PathContainers, req, &out)
}

// Get returns one container.
func (c *Client) Get(ctx context.Context, name string) (v1.Container, error) {
	var out v1.Container
	return out, c.do(ctx, http.MethodGet, v1.PathContainer+url.PathEscape(name), nil, &out)
}

// Remove deletes a container (killing it first if force).
func (c *Client) Remove(ctx context.Context, name string, force bool) error {
	q := ""
	if force {
		q = "?force=1"
	}
	return c.do(ctx, http.MethodDelete, v1.PathContainer+url.PathEscape(name)+q, nil, nil)
}

// Checkpoint checkpoints a container.
func (c *Client) Checkpoint(ctx context.Context, req v1.CheckpointRequest) (v1.Checkpoint, error) {
	var out v1.Checkpoint
	return out, c.do(ctx, http.MethodPost, v1.PathCheckpoint, req, &out)
}

// Restore restores a container.
func (c *Client) Restore(ctx context.Context, req v1.RestoreRequest) (v1.Container, error) {
	var out v1.Container
	return out, c.do(ctx, http.MethodPost, v1.PathRestore, req, &out)
}

// Checkpoints lists a container's checkpoints.
func (c *Client) Checkpoints(ctx context.Context, container string) ([]v1.Checkpoint, error) {
	var out []v1.Checkpoint
	return out, c.do(ctx, http.MethodGet, v1.PathCheckpoints+"?container="+url.QueryEscape(container), nil, &out)
}

// RankStall locks and freezes ranks on the agent (a migration's stall).
func (c *Client) RankStall(ctx context.Context, req v1.RankStall) error {
	return c.do(ctx, http.MethodPost, v1.PathRankStall, req, nil)
}

// MigrateIn brings a rank prepared on another node here, restored frozen.
func (c *Client) MigrateIn(ctx context.Context, req v1.MigrateIn) (v1.MigratedIn, error) {
	var out v1.MigratedIn
	return out, c.do(ctx, http.MethodPost, v1.PathMigrateIn, req, &out)
}

// MigrateOut removes a rank that moved away.
func (c *Client) MigrateOut(ctx context.Context, req v1.MigrateOut) error {
	return c.do(ctx, http.MethodPost, v1.PathMigrateOut, req, nil)
}

// DropImages removes every checkpoint image of the named containers.
func (c *Client) DropImages(ctx context.Context, req v1.DropImages) (v1.Dropped, error) {
	var out v1.Dropped
	return out, c.do(ctx, http.MethodPost, v1.PathDropImages, req, &out)
}
