package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	v1 "cairn/api/agent/v1"
	"cairn/internal/pki"
)

// Client calls one agent. Errors the agent returns are *v1.Error.
type Client struct {
	base string
	http *http.Client
}

// NewClient returns a client for the agent at addr (host:port) whose
// certificate names serverName, authenticating with creds.
func NewClient(addr, serverName string, creds *pki.Credentials) *Client {
	tr := &http.Transport{TLSClientConfig: pki.ClientConfig(creds, serverName), ForceAttemptHTTP2: true}
	return &Client{base: "https://" + addr, http: &http.Client{Transport: tr, Timeout: 10 * time.Minute}}
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e v1.Error
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Code == "" {
			return fmt.Errorf("%s %s: HTTP %d", method, path, resp.StatusCode)
		}
		return &e
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
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
