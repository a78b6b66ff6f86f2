package launch

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// The wire protocol between an agent (or a rank 0 daemon) and a launch
// daemon, over TCP on the job network:
//
//  1. The daemon sends a nonce of NonceSize random bytes.
//  2. The client answers with HMAC-SHA256(secret, authContext || nonce).
//     A wrong answer closes the connection.
//  3. Frames follow, each [type: 1 byte][length: 4 bytes, big endian]
//     [payload], at most maxFrame bytes of payload.
//
// Client to daemon: frameCommand (a command line, run with /bin/sh -c as
// ssh would), frameStdin (bytes for its stdin), frameStdinEOF,
// frameSignal (1 byte: a signal number for its process group), framePing
// (answered by frameExit 0), frameQuit (4 bytes: the launcher's exit code;
// the daemon ends its commands and exits).
//
// Daemon to client: frameStdout, frameStderr, frameExit (4 bytes, big
// endian: the exit status, 128+N for signal N), always the last frame.
const (
	frameCommand  = 'C'
	frameStdin    = 'I'
	frameStdinEOF = 'i'
	frameSignal   = 'K'
	framePing     = 'P'
	frameQuit     = 'Q'
	frameStdout   = 'O'
	frameStderr   = 'E'
	frameExit     = 'X'
)

// NonceSize is the size of a daemon's challenge.
const NonceSize = 32

// authContext separates this protocol's MACs from any other use of the
// secret.
const authContext = "cairn-launch-v1"

// maxFrame bounds a frame's payload; a larger one ends the connection.
const maxFrame = 1 << 20

// handshakeTimeout bounds the challenge and its answer.
const handshakeTimeout = 10 * time.Second

// ErrAuth is returned when a peer does not prove it holds the job's
// secret.
var ErrAuth = errors.New("launch: peer failed authentication")

func mac(secret, nonce []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(authContext))
	h.Write(nonce)
	return h.Sum(nil)
}

// conn is a framed connection; send may be called concurrently.
type conn struct {
	c  net.Conn
	r  *bufio.Reader
	mu sync.Mutex
}

func newConn(c net.Conn) *conn { return &conn{c: c, r: bufio.NewReader(c)} }

func (c *conn) send(t byte, p []byte) error {
	if len(p) > maxFrame {
		return fmt.Errorf("launch: frame of %d bytes", len(p))
	}
	b := make([]byte, 5+len(p))
	b[0] = t
	binary.BigEndian.PutUint32(b[1:5], uint32(len(p)))
	copy(b[5:], p)
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := c.c.Write(b)
	return err
}

func (c *conn) recv() (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("launch: frame of %d bytes", n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(c.r, p); err != nil {
		return 0, nil, err
	}
	return h[0], p, nil
}

func code32(v int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(int32(v))) }

func codeOf(p []byte) int {
	if len(p) != 4 {
		return 255
	}
	return int(int32(binary.BigEndian.Uint32(p)))
}

// challenge is the daemon's side of the handshake.
func challenge(c *conn, secret []byte) error {
	nonce := make([]byte, NonceSize)
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	_ = c.c.SetDeadline(time.Now().Add(handshakeTimeout))
	defer c.c.SetDeadline(time.Time{})
	if _, err := c.c.Write(nonce); err != nil {
		return err
	}
	answer := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c.r, answer); err != nil {
		return err
	}
	if !hmac.Equal(answer, mac(secret, nonce)) {
		return ErrAuth
	}
	return nil
}

// dial connects to the launch daemon at addr and answers its challenge.
func dial(addr string, secret []byte, timeout time.Duration) (*conn, error) {
	d := net.Dialer{Timeout: timeout}
	d.SetMultipathTCP(false) // CRIU cannot dump MPTCP sockets
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c := newConn(nc)
	_ = nc.SetDeadline(time.Now().Add(handshakeTimeout))
	nonce := make([]byte, NonceSize)
	if _, err := io.ReadFull(c.r, nonce); err != nil {
		nc.Close()
		return nil, fmt.Errorf("launch: %s: no challenge: %w", addr, err)
	}
	if _, err := nc.Write(mac(secret, nonce)); err != nil {
		nc.Close()
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	return c, nil
}
