package pki_test

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/pki"
)

// cluster is a CA with credentials for every role, all issued for tests.
type cluster struct {
	ca    *pki.CA
	coord *pki.Credentials // "coord", also valid for 127.0.0.1
	agent *pki.Credentials // "node1"
	cli   *pki.Credentials // "cli"
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	ca, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatalf("Init: %v", err)
	}
	return &cluster{
		ca:    ca,
		coord: issue(t, ca, "coord", pki.Coordinator, pki.IssueOptions{IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}),
		agent: issue(t, ca, "node1", pki.Agent, pki.IssueOptions{}),
		cli:   issue(t, ca, "cli", pki.Client, pki.IssueOptions{}),
	}
}

func issue(t *testing.T, ca *pki.CA, name string, role pki.Role, opts pki.IssueOptions) *pki.Credentials {
	t.Helper()
	c, err := ca.Issue(name, role, opts)
	if err != nil {
		t.Fatalf("Issue(%q, %q): %v", name, role, err)
	}
	return c
}

// expired returns IssueOptions for a certificate that expired yesterday.
func expired() pki.IssueOptions {
	now := time.Now()
	return pki.IssueOptions{
		IPs:       []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: now.Add(-48 * time.Hour),
		NotAfter:  now.Add(-24 * time.Hour),
	}
}

// side is what one end of a connection saw.
type side struct {
	state tls.ConnectionState
	err   error
}

// handshake connects a client to a server over loopback and returns what
// each side saw. After its handshake the server writes one byte, which the
// client reads: in TLS 1.3 the client's handshake ends before the server
// has checked the client's certificate, so only that read tells the client
// it was refused. Everything is bounded by a 5 s deadline.
func handshake(t *testing.T, server, client *tls.Config) (srv, cli side) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()
	deadline := time.Now().Add(5 * time.Second)

	done := make(chan side, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- side{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(deadline)
		tc := tls.Server(c, server)
		err = tc.Handshake()
		if err == nil {
			_, err = tc.Write([]byte{1})
		}
		done <- side{state: tc.ConnectionState(), err: err}
	}()

	d := net.Dialer{Deadline: deadline}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	c.SetDeadline(deadline)
	tc := tls.Client(c, client)
	err = tc.Handshake()
	if err == nil {
		_, err = io.ReadFull(tc, make([]byte, 1))
	}
	cli = side{state: tc.ConnectionState(), err: err}
	tc.Close()
	return <-done, cli
}
