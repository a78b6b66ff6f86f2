package rankclient

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
)

// Sentinels for the agent's error codes: errors.Is(err, ErrForbidden) is
// true of an *Error with code forbidden, and so on.
var (
	ErrBadRequest  = errors.New(rankv1.CodeBadRequest)
	ErrForbidden   = errors.New(rankv1.CodeForbidden)
	ErrNotFound    = errors.New(rankv1.CodeNotFound)
	ErrRateLimited = errors.New(rankv1.CodeRateLimited)
	ErrUnavailable = errors.New(rankv1.CodeUnavailable)
	ErrAborted     = errors.New(rankv1.CodeAborted)
	ErrConflict    = errors.New(rankv1.CodeConflict)
)

var sentinels = map[string]error{
	rankv1.CodeBadRequest:  ErrBadRequest,
	rankv1.CodeForbidden:   ErrForbidden,
	rankv1.CodeNotFound:    ErrNotFound,
	rankv1.CodeRateLimited: ErrRateLimited,
	rankv1.CodeUnavailable: ErrUnavailable,
	rankv1.CodeAborted:     ErrAborted,
	rankv1.CodeConflict:    ErrConflict,
}

// ErrNoEndpoint: the socket's directory does not exist, so the socket is
// not away for a while but not there at all: the caller is not in a rank.
var ErrNoEndpoint = errors.New("no rank endpoint: not in a rank of cairn's")

// ErrProtocol: the agent's reply is not what the protocol says.
var ErrProtocol = errors.New("rank API protocol error")

// Error is an error reply of the agent's.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return e.Code
	}
	return e.Code + ": " + e.Message
}

// Is matches e against the sentinel of its code.
func (e *Error) Is(target error) bool { return sentinels[e.Code] == target && target != nil }

// Client talks to the rank endpoint at Path.
type Client struct {
	// Path is the socket's: New takes it from $CAIRN_SOCKET, else
	// rankv1.SocketPath.
	Path string
	// Job, if set, is named in every request. It is never needed: the
	// agent refuses any job but the caller's own (ErrForbidden).
	Job string
	// Retry is how long to wait before trying again while the endpoint
	// is away, and between polls of a pending checkpoint (New: 50 ms).
	Retry time.Duration
}

// New returns a client of the endpoint in this rank's container.
func New() *Client {
	path := os.Getenv(rankv1.EnvSocket)
	if path == "" {
		path = rankv1.SocketPath
	}
	return &Client{Path: path, Retry: 50 * time.Millisecond}
}

// Info is where the rank stands (the info and watch replies).
type Info struct {
	Job          string `json:"job"`
	Rank         int    `json:"rank"`
	Size         int    `json:"size"`
	Mode         string `json:"mode"`
	Ckpt         int    `json:"ckpt"`
	Restored     bool   `json:"restored"`
	RestoredFrom int    `json:"restored_from"`
	Incarnation  int    `json:"incarnation"`
}

func (i Info) String() string {
	return fmt.Sprintf("job=%s rank=%d size=%d mode=%s ckpt=%d restored=%t restored_from=%d incarnation=%d",
		i.Job, i.Rank, i.Size, i.Mode, i.Ckpt, i.Restored, i.RestoredFrom, i.Incarnation)
}

func infoOf(r rankv1.Reply) Info {
	i := Info{Job: r.Job, Size: r.Size, Mode: r.Mode, Ckpt: r.Ckpt, Restored: r.Restored, RestoredFrom: r.RestoredFrom, Incarnation: r.Incarnation}
	if r.Rank != nil {
		i.Rank = *r.Rank
	}
	return i
}

// Result is the outcome of a checkpoint the rank asked for: State done
// (Ckpt was taken) or restored (the rank runs restored from RestoredFrom).
type Result struct {
	State        string `json:"state"`
	Ckpt         int    `json:"ckpt,omitempty"`
	RestoredFrom int    `json:"restored_from,omitempty"`
}

func (r Result) String() string {
	if r.State == rankv1.StateRestored {
		return fmt.Sprintf("restored from checkpoint %d", r.RestoredFrom)
	}
	return fmt.Sprintf("checkpoint %d done", r.Ckpt)
}

// Info asks where the rank stands.
func (c *Client) Info(ctx context.Context) (Info, error) {
	r, err := c.call(ctx, rankv1.Request{Op: rankv1.OpInfo})
	return infoOf(r), err
}

// Checkpoint asks for a global checkpoint of the rank's job (with stop,
// the job is then stopped) and waits for its outcome. The rank is frozen
// with the others meanwhile; Checkpoint returns once it runs again: after
// the checkpoint (done), or, like fork, a second time in a rank restored
// from it (restored). A round that aborted is ErrAborted.
func (c *Client) Checkpoint(ctx context.Context, stop bool) (Result, error) {
	r, err := c.call(ctx, rankv1.Request{Op: rankv1.OpCheckpoint, Stop: stop, ID: newID()})
	if err != nil {
		return Result{}, fmt.Errorf("ask for a checkpoint: %w", err)
	}
	ticket := r.Ticket
	if ticket == "" {
		return Result{}, fmt.Errorf("%w: checkpoint reply without a ticket", ErrProtocol)
	}
	for {
		r, err := c.call(ctx, rankv1.Request{Op: rankv1.OpResult, Ticket: ticket})
		if err != nil {
			return Result{}, fmt.Errorf("checkpoint %s: %w", ticket, err)
		}
		switch r.State {
		case rankv1.StateDone, rankv1.StateRestored:
			return Result{State: r.State, Ckpt: r.Ckpt, RestoredFrom: r.RestoredFrom}, nil
		case rankv1.StatePending:
		default:
			return Result{}, fmt.Errorf("%w: result state %q", ErrProtocol, r.State)
		}
		if err := c.wait(ctx); err != nil {
			return Result{}, err
		}
	}
}

// Event publishes an event of the rank's on the cluster's event stream:
// kind is 1-32 letters, digits, '.', '-' or '_', message at most 1,024
// bytes. A job may publish 10 a second, in bursts of 20 (else
// ErrRateLimited).
func (c *Client) Event(ctx context.Context, kind, message string) error {
	_, err := c.call(ctx, rankv1.Request{Op: rankv1.OpEvent, Kind: kind, Message: message, ID: newID()})
	return err
}

// newID names a request that changes something, so that the endpoint
// carries it out once however often it is sent (docs/rank-api.md).
func newID() string { return rand.Text() }

// call sends req on a connection of its own and returns the reply, trying
// again while the endpoint is away.
func (c *Client) call(ctx context.Context, req rankv1.Request) (rankv1.Reply, error) {
	conn, _, r, err := c.open(ctx, req)
	if conn != nil {
		conn.Close()
	}
	return r, err
}

// errAway: the endpoint is away for now (no socket, nobody listening, or
// the connection closed before the reply).
var errAway = errors.New("rank endpoint away")

// open sends req and reads its reply, trying again every Retry while the
// endpoint is away. The connection stays open (for a watch); an error
// reply is an *Error.
func (c *Client) open(ctx context.Context, req rankv1.Request) (net.Conn, *bufio.Reader, rankv1.Reply, error) {
	req.Job = c.Job
	line, err := json.Marshal(req)
	if err != nil {
		return nil, nil, rankv1.Reply{}, err
	}
	line = append(line, '\n')
	if len(line) > rankv1.MaxLine {
		return nil, nil, rankv1.Reply{}, &Error{Code: rankv1.CodeBadRequest, Message: "request longer than 64 KiB"}
	}
	for {
		conn, rd, reply, err := c.try(ctx, line)
		if !errors.Is(err, errAway) {
			if err == nil && !reply.OK {
				err = &Error{Code: reply.Code, Message: reply.Error}
			}
			return conn, rd, reply, err
		}
		if _, serr := os.Stat(filepath.Dir(c.Path)); errors.Is(serr, os.ErrNotExist) {
			return nil, nil, rankv1.Reply{}, fmt.Errorf("%w (%s)", ErrNoEndpoint, c.Path)
		}
		if err := c.wait(ctx); err != nil {
			return nil, nil, rankv1.Reply{}, err
		}
	}
}

func (c *Client) try(ctx context.Context, line []byte) (net.Conn, *bufio.Reader, rankv1.Reply, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.Path)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, rankv1.Reply{}, ctx.Err()
		}
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EAGAIN) {
			return nil, nil, rankv1.Reply{}, errAway
		}
		return nil, nil, rankv1.Reply{}, err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	rd := bufio.NewReader(conn)
	var reply rankv1.Reply
	b, err := writeRead(conn, rd, line)
	if err == nil {
		if jerr := json.Unmarshal(b, &reply); jerr != nil {
			err = fmt.Errorf("%w: reply %.80q: %v", ErrProtocol, b, jerr)
		}
	}
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, nil, reply, ctx.Err()
		}
		return nil, nil, reply, err
	}
	return conn, rd, reply, nil
}

// writeRead sends line and reads one line back; a connection closed
// before the reply is errAway.
func writeRead(conn net.Conn, rd *bufio.Reader, line []byte) ([]byte, error) {
	if _, err := conn.Write(line); err != nil {
		return nil, errAway
	}
	b, err := readLine(rd)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed) {
		return nil, errAway
	}
	return b, err
}

// readLine reads one message; one too long is ErrProtocol.
func readLine(r *bufio.Reader) ([]byte, error) {
	line, err := rankv1.ReadLine(r)
	if errors.Is(err, rankv1.ErrTooLong) {
		return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return line, err
}

// wait waits Retry, or until ctx ends.
func (c *Client) wait(ctx context.Context) error {
	t := time.NewTimer(c.Retry)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
