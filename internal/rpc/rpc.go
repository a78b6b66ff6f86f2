// Package rpc is the client side of cairn's two wire APIs: AgentClient
// calls an agent (api/agent/v1), CoordClient the coordinator
// (api/coord/v1), both JSON over HTTPS with mutual TLS from package pki,
// errors as a agentv1.Error body. The clients live beside the wire rather than
// beside their servers, so that calling a node does not link the node's
// stack (containers, CRIU, the store) into the caller, nor calling the
// coordinator its etcd. The server side both APIs share (Serve, Caller,
// the error bodies) is here too, and Run, the one http.Server lifecycle,
// also serves the dashboard's loopback port.
package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/pki"
)

// Client calls one server. Errors the server returns are *agentv1.Error.
type Client struct {
	base    string
	http    *http.Client
	streams *http.Client // no overall timeout: a stream lasts as long as it lasts
	term    agentv1.Term // sent as agentv1.TermHeader when set
}

// dialTimeout bounds a connection's setup.
const dialTimeout = 5 * time.Second

// New returns a client for the server at addr (host:port) whose
// certificate names serverName, authenticating with creds. timeout bounds
// each call but streams.
func New(addr, serverName string, creds *pki.Credentials, timeout time.Duration) *Client {
	// A host that is down does not refuse: the dial gives up after
	// dialTimeout rather than the kernel's minutes of retries. A process
	// that is stopped has its connections accepted by the kernel, and
	// never shakes hands.
	tr := &http.Transport{TLSClientConfig: pki.ClientConfig(creds, serverName), ForceAttemptHTTP2: true,
		DialContext:         (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: dialTimeout}
	return &Client{base: "https://" + addr, http: &http.Client{Transport: tr, Timeout: timeout}, streams: &http.Client{Transport: tr}}
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Do sends body (if not nil) as JSON and decodes the reply into out (if
// not nil).
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
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
	c.setTerm(req)
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if err := replyError(method, path, resp); err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// Stream GETs path (or POSTs body as JSON, if not nil) and returns the
// reply's body for the caller to read and close.
func (c *Client) Stream(ctx context.Context, path string, body any) (io.ReadCloser, error) {
	rc, _, err := c.StreamHeader(ctx, path, body)
	return rc, err
}

// StreamHeader is Stream, returning the reply's header too.
func (c *Client) StreamHeader(ctx context.Context, path string, body any) (io.ReadCloser, http.Header, error) {
	method, rd := http.MethodGet, io.Reader(nil)
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, nil, err
		}
		method, rd = http.MethodPost, bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, nil, err
	}
	c.setTerm(req)
	resp, err := c.streams.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if err := replyError(method, path, resp); err != nil {
		resp.Body.Close()
		return nil, nil, err
	}
	return resp.Body, resp.Header, nil
}

// Duplex POSTs body as a stream (sent while the reply comes, over
// HTTP/2) and returns the reply's body, to read as it comes.
func (c *Client) Duplex(ctx context.Context, path string, body io.Reader) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	c.setTerm(req)
	resp, err := c.streams.Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", path, err)
	}
	if err := replyError(http.MethodPost, path, resp); err != nil {
		resp.Body.Close()
		return nil, err
	}
	return resp.Body, nil
}

func (c *Client) setTerm(req *http.Request) {
	if c.term.N != 0 {
		req.Header.Set(agentv1.TermHeader, c.term.String())
	}
}

func replyError(method, path string, resp *http.Response) error {
	if resp.StatusCode < 300 {
		return nil
	}
	var e agentv1.Error
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Code == "" {
		return fmt.Errorf("%s %s: HTTP %d", method, path, resp.StatusCode)
	}
	return &e
}
