package rpc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/pki"
)

// AgentClient calls one agent. Errors the agent returns are *agentv1.Error.
type AgentClient struct{ rpc *Client }

// NewAgentClient returns a client for the agent at addr (host:port) whose
// certificate names serverName, authenticating with creds.
func NewAgentClient(addr, serverName string, creds *pki.Credentials) *AgentClient {
	return &AgentClient{New(addr, serverName, creds, 10*time.Minute)}
}

// NewTermAgentClient is NewAgentClient for a coordinator of the given
// term, which every call carries (agentv1.TermHeader).
func NewTermAgentClient(addr, serverName string, creds *pki.Credentials, term agentv1.Term) *AgentClient {
	c := NewAgentClient(addr, serverName, creds)
	c.rpc.term = term
	return c
}

// Close releases idle connections.
func (c *AgentClient) Close() { c.rpc.Close() }

func (c *AgentClient) do(ctx context.Context, method, path string, body, out any) error {
	return c.rpc.Do(ctx, method, path, body, out)
}

func (c *AgentClient) stream(ctx context.Context, path string) (io.ReadCloser, error) {
	return c.rpc.Stream(ctx, path, nil)
}

// Chunks lists the chunk ids of a checkpoint image on the agent.
func (c *AgentClient) Chunks(ctx context.Context, container string, seq int) ([]string, error) {
	var out agentv1.Chunks
	err := c.do(ctx, http.MethodGet, fmt.Sprintf("%s?container=%s&seq=%d", agentv1.PathChunks, url.QueryEscape(container), seq), nil, &out)
	return out.IDs, err
}

// ExportDelta opens a delta export stream of a checkpoint image holding
// only the given chunks.
func (c *AgentClient) ExportDelta(ctx context.Context, req agentv1.ExportDelta) (io.ReadCloser, error) {
	return c.rpc.Stream(ctx, agentv1.PathExportDelta, req)
}

// ChunkData opens a chunk stream of the given chunks of a checkpoint
// image.
func (c *AgentClient) ChunkData(ctx context.Context, req agentv1.ChunkData) (io.ReadCloser, error) {
	return c.rpc.Stream(ctx, agentv1.PathChunkData, req)
}

// JobNet ensures a job's network on the agent's node.
func (c *AgentClient) JobNet(ctx context.Context, req agentv1.JobNet) error {
	return c.do(ctx, http.MethodPut, agentv1.PathJobNet, req, nil)
}

// DeleteJobNet removes a job's network devices from the agent's node.
func (c *AgentClient) DeleteJobNet(ctx context.Context, vni uint32) error {
	return c.do(ctx, http.MethodDelete, fmt.Sprintf("%s?vni=%d", agentv1.PathJobNet, vni), nil, nil)
}

// RankRun starts a rank.
func (c *AgentClient) RankRun(ctx context.Context, req agentv1.RankRun) (agentv1.Container, error) {
	var out agentv1.Container
	return out, c.do(ctx, http.MethodPost, agentv1.PathRankRun, req, &out)
}

// RankRestore restores a rank frozen, with its network locked.
func (c *AgentClient) RankRestore(ctx context.Context, req agentv1.RankRestore) (agentv1.Container, error) {
	var out agentv1.Container
	return out, c.do(ctx, http.MethodPost, agentv1.PathRankRestore, req, &out)
}

// RankResume unlocks and thaws restored ranks.
func (c *AgentClient) RankResume(ctx context.Context, req agentv1.RankResume) error {
	return c.do(ctx, http.MethodPost, agentv1.PathRankResume, req, nil)
}

// RankRemove removes a rank's container and network.
func (c *AgentClient) RankRemove(ctx context.Context, req agentv1.RankRemove) error {
	return c.do(ctx, http.MethodPost, agentv1.PathRankRemove, req, nil)
}

// Prepare runs phase one of a global checkpoint for a rank.
func (c *AgentClient) Prepare(ctx context.Context, req agentv1.Prepare) (agentv1.Prepared, error) {
	var out agentv1.Prepared
	return out, c.do(ctx, http.MethodPost, agentv1.PathPrepare, req, &out)
}

// Commit commits a prepared rank and returns once its image is durable.
func (c *AgentClient) Commit(ctx context.Context, req agentv1.Finish) (agentv1.Committed, error) {
	var out agentv1.Committed
	return out, c.do(ctx, http.MethodPost, agentv1.PathCommit, req, &out)
}

// Abort aborts a prepared rank.
func (c *AgentClient) Abort(ctx context.Context, req agentv1.Finish) error {
	return c.do(ctx, http.MethodPost, agentv1.PathAbort, req, nil)
}

// Fetch has the agent copy an image from another agent.
func (c *AgentClient) Fetch(ctx context.Context, req agentv1.Fetch) (agentv1.Image, error) {
	var out agentv1.Image
	return out, c.do(ctx, http.MethodPost, agentv1.PathFetch, req, &out)
}

// Kill sends a signal to a container's processes.
func (c *AgentClient) Kill(ctx context.Context, name string, sig int) error {
	return c.do(ctx, http.MethodPost, fmt.Sprintf("%s%s?signal=%d", agentv1.PathKill, url.PathEscape(name), sig), nil, nil)
}

// Health asks who the agent is.
func (c *AgentClient) Health(ctx context.Context) (agentv1.Health, error) {
	var h agentv1.Health
	return h, c.do(ctx, http.MethodGet, agentv1.PathHealth, nil, &h)
}

// List returns the agent's containers.
func (c *AgentClient) List(ctx context.Context) ([]agentv1.Container, error) {
	var out []agentv1.Container
	return out, c.do(ctx, http.MethodGet, agentv1.PathContainers, nil, &out)
}

// Run starts a container.
func (c *AgentClient) Run(ctx context.Context, req agentv1.RunRequest) (agentv1.Container, error) {
	var out agentv1.Container
	return out, c.do(ctx, http.MethodPost, agentv1.PathContainers, req, &out)
}

// Get returns one container.
func (c *AgentClient) Get(ctx context.Context, name string) (agentv1.Container, error) {
	var out agentv1.Container
	return out, c.do(ctx, http.MethodGet, agentv1.PathContainer+url.PathEscape(name), nil, &out)
}

// Remove deletes a container (killing it first if force).
func (c *AgentClient) Remove(ctx context.Context, name string, force bool) error {
	q := ""
	if force {
		q = "?force=1"
	}
	return c.do(ctx, http.MethodDelete, agentv1.PathContainer+url.PathEscape(name)+q, nil, nil)
}

// Checkpoint checkpoints a container.
func (c *AgentClient) Checkpoint(ctx context.Context, req agentv1.CheckpointRequest) (agentv1.Checkpoint, error) {
	var out agentv1.Checkpoint
	return out, c.do(ctx, http.MethodPost, agentv1.PathCheckpoint, req, &out)
}

// Restore restores a container.
func (c *AgentClient) Restore(ctx context.Context, req agentv1.RestoreRequest) (agentv1.Container, error) {
	var out agentv1.Container
	return out, c.do(ctx, http.MethodPost, agentv1.PathRestore, req, &out)
}

// Checkpoints lists a container's checkpoints.
func (c *AgentClient) Checkpoints(ctx context.Context, container string) ([]agentv1.Checkpoint, error) {
	var out []agentv1.Checkpoint
	return out, c.do(ctx, http.MethodGet, agentv1.PathCheckpoints+"?container="+url.QueryEscape(container), nil, &out)
}

// RankStall locks and freezes ranks on the agent (a migration's stall).
func (c *AgentClient) RankStall(ctx context.Context, req agentv1.RankStall) error {
	return c.do(ctx, http.MethodPost, agentv1.PathRankStall, req, nil)
}

// MigrateIn brings a rank prepared on another node here, restored frozen.
func (c *AgentClient) MigrateIn(ctx context.Context, req agentv1.MigrateIn) (agentv1.MigratedIn, error) {
	var out agentv1.MigratedIn
	return out, c.do(ctx, http.MethodPost, agentv1.PathMigrateIn, req, &out)
}

// MigrateOut removes a rank that moved away.
func (c *AgentClient) MigrateOut(ctx context.Context, req agentv1.MigrateOut) error {
	return c.do(ctx, http.MethodPost, agentv1.PathMigrateOut, req, nil)
}

// DropImages removes every checkpoint image of the named containers.
func (c *AgentClient) DropImages(ctx context.Context, req agentv1.DropImages) (agentv1.Dropped, error) {
	var out agentv1.Dropped
	return out, c.do(ctx, http.MethodPost, agentv1.PathDropImages, req, &out)
}

// TierFlush uploads images of the node into the durable tier.
func (c *AgentClient) TierFlush(ctx context.Context, req agentv1.TierFlush) (agentv1.TierFlushed, error) {
	var out agentv1.TierFlushed
	return out, c.do(ctx, http.MethodPost, agentv1.PathTierFlush, req, &out)
}

// TierFetch brings an image from the durable tier into the node's store.
func (c *AgentClient) TierFetch(ctx context.Context, req agentv1.TierFetch) (agentv1.Image, error) {
	var out agentv1.Image
	return out, c.do(ctx, http.MethodPost, agentv1.PathTierFetch, req, &out)
}

// TierRecord writes a global checkpoint's record into the durable tier.
func (c *AgentClient) TierRecord(ctx context.Context, req agentv1.TierRecord) error {
	return c.do(ctx, http.MethodPost, agentv1.PathTierRecord, req, nil)
}

// TierRead reads a global checkpoint's record from the durable tier.
func (c *AgentClient) TierRead(ctx context.Context, req agentv1.TierRead) (agentv1.TierRecord, error) {
	var out agentv1.TierRecord
	return out, c.do(ctx, http.MethodPost, agentv1.PathTierRead, req, &out)
}

// TierPrune deletes what is no longer kept from the durable tier.
func (c *AgentClient) TierPrune(ctx context.Context, req agentv1.TierPrune) (agentv1.TierPruned, error) {
	var out agentv1.TierPruned
	return out, c.do(ctx, http.MethodPost, agentv1.PathTierPrune, req, &out)
}

// ErrNoStagedSize is matched by the error of Staged when the agent did
// not announce the stream's size: a damaged stream.
var ErrNoStagedSize = errors.New("no size announced")

// Staged opens the staged-image stream of a rank prepared on the agent
// and returns it with the size the agent announced for it; lazy leaves
// the pages out (image.WriteStagedLazy), for StagedPages to read.
func (c *AgentClient) Staged(ctx context.Context, container string, seq int, lazy bool) (io.ReadCloser, int64, error) {
	q := "?container=" + url.QueryEscape(container) + "&seq=" + strconv.Itoa(seq)
	if lazy {
		q += "&lazy=1"
	}
	body, h, err := c.rpc.StreamHeader(ctx, agentv1.PathStaged+q, nil)
	if err != nil {
		return nil, 0, err
	}
	size, err := strconv.ParseInt(h.Get(agentv1.HeaderStagedSize), 10, 64)
	if err != nil {
		body.Close()
		return nil, 0, fmt.Errorf("staged image stream of %s:%d: %w: %v", container, seq, ErrNoStagedSize, err)
	}
	return body, size, nil
}

// StagedPages opens the pages req asks for, of a staged image on the
// agent: 4 KiB each, in the order asked.
func (c *AgentClient) StagedPages(ctx context.Context, req agentv1.StagedPages) (io.ReadCloser, error) {
	return c.rpc.Stream(ctx, agentv1.PathStagedPages, req)
}

// StagedDone tells the agent that a post-copy migration's target no
// longer needs the pages of a staged image.
func (c *AgentClient) StagedDone(ctx context.Context, ref agentv1.ImageRef) error {
	return c.do(ctx, http.MethodPost, agentv1.PathStagedDone, ref, nil)
}

// Export opens the export stream of a checkpoint on the agent; with
// background, the agent streams it at the lowest priority.
func (c *AgentClient) Export(ctx context.Context, container string, seq int, background bool) (io.ReadCloser, error) {
	q := "?container=" + url.QueryEscape(container) + "&seq=" + strconv.Itoa(seq)
	if background {
		q += "&background=1"
	}
	return c.stream(ctx, agentv1.PathExport+q)
}

// Log opens a container's output as q asks.
func (c *AgentClient) Log(ctx context.Context, name string, q agentv1.LogQuery) (io.ReadCloser, error) {
	p := agentv1.PathLogs + url.PathEscape(name)
	if v := q.Values(); len(v) > 0 {
		p += "?" + v.Encode()
	}
	return c.stream(ctx, p)
}

// Exec runs args in a running container on the agent's node, its output
// written to stdout and stderr as it comes, and returns its exit code.
// With stdin nil the command gets no input; else stdin is streamed to it.
// A failure before the command ran is an *agentv1.Error
// (CodeExecNotFound, CodeExecNotExecutable, CodeNotFound, ...).
func (c *AgentClient) Exec(ctx context.Context, name string, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	q := url.Values{"arg": args}
	body := io.Reader(http.NoBody)
	if stdin != nil {
		q.Set("stdin", "1")
		body = stdin
	}
	rc, err := c.rpc.Duplex(ctx, agentv1.PathExec+url.PathEscape(name)+"?"+q.Encode(), body)
	if err != nil {
		return -1, err
	}
	defer rc.Close()
	return execReply(rc, name, stdout, stderr)
}

// ExecTTY runs args in a running container on the agent's node on a
// terminal of size size, which the agent makes: the command's output
// (stdout and stderr merged) is written to out as it comes, its input is
// stdin's (nil: none), and each size from resizes is the terminal's new
// one. It returns the command's exit code; failures are as Exec's.
func (c *AgentClient) ExecTTY(ctx context.Context, name string, args []string, stdin io.Reader, out io.Writer, size agentv1.WinSize, resizes <-chan agentv1.WinSize) (int, error) {
	q := url.Values{"arg": args, "tty": {"1"}, "rows": {strconv.Itoa(int(size.Rows))}, "cols": {strconv.Itoa(int(size.Cols))}}
	pr, pw := io.Pipe()
	defer pw.Close()
	var mu sync.Mutex // one frame at a time
	send := func(kind byte, data []byte) error {
		mu.Lock()
		defer mu.Unlock()
		return agentv1.WriteExecFrame(pw, kind, data)
	}
	done := make(chan struct{})
	defer close(done)
	if stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := stdin.Read(buf)
				if n > 0 && send(agentv1.ExecStdin, buf[:n]) != nil {
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	go func() {
		for {
			select {
			case <-done:
				return
			case ws := <-resizes:
				if send(agentv1.ExecResize, ws.Encode()) != nil {
					return
				}
			}
		}
	}()
	rc, err := c.rpc.Duplex(ctx, agentv1.PathExec+url.PathEscape(name)+"?"+q.Encode(), pr)
	if err != nil {
		return -1, err
	}
	defer rc.Close()
	return execReply(rc, name, out, out)
}

// execReply reads PathExec's reply frames, writing the command's output
// to stdout and stderr, and returns its exit code.
func execReply(rc io.Reader, name string, stdout, stderr io.Writer) (int, error) {
	for {
		f, err := agentv1.ReadExecFrame(rc)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // no exit frame: the agent or the link went away
			}
			return -1, fmt.Errorf("exec in %s: %w", name, err)
		}
		switch f.Kind {
		case agentv1.ExecStdout:
			_, err = stdout.Write(f.Data)
		case agentv1.ExecStderr:
			_, err = stderr.Write(f.Data)
		case agentv1.ExecExit:
			if len(f.Data) != 4 {
				return -1, fmt.Errorf("exec in %s: exit frame of %d bytes", name, len(f.Data))
			}
			return int(int32(binary.BigEndian.Uint32(f.Data))), nil
		default:
			return -1, fmt.Errorf("exec in %s: frame of kind %d", name, f.Kind)
		}
		if err != nil {
			return -1, err
		}
	}
}

// Incarnations lists a container's incarnations on the agent's node,
// oldest first.
func (c *AgentClient) Incarnations(ctx context.Context, name string) ([]agentv1.Incarnation, error) {
	var out []agentv1.Incarnation
	err := c.do(ctx, http.MethodGet, agentv1.PathIncarnations+url.PathEscape(name), nil, &out)
	return out, err
}
