package lazy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Page-server commands (criu/page-xfer.c).
const (
	cmdGet        = 7
	cmdAddF       = 6
	cmdClose      = 0x1023
	cmdForceClose = 0x1024
	cmdMask       = 0xffff
)

// Source gives the bytes of an image's pages files.
type Source interface {
	// ReadPages fills p with the bytes at off of the pages file named
	// file (pages-N.img). It blocks until they are here, verified.
	ReadPages(ctx context.Context, file string, p []byte, off int64) error
}

// maxInFlight bounds the requests read ahead of the reply being written:
// the daemon sends one background request per process plus its faults.
const maxInFlight = 64

// Server is a page server for one lazy restore: it serves the one
// connection of its `criu lazy-pages` daemon until the daemon closes the
// session, and then stops.
type Server struct {
	pms map[int]*Pagemap
	src Source
	log *slog.Logger
	ln  net.Listener

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	err    error

	pages    atomic.Int64 // served
	requests atomic.Int64
	started  time.Time
	ended    time.Time
}

// Listen starts a page server on a loopback port for the processes of
// pms, their pages read from src.
func Listen(pms map[int]*Pagemap, src Source, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("page server: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{pms: pms, src: src, log: log, ln: ln, ctx: ctx, cancel: cancel, done: make(chan struct{}), started: time.Now()}
	go s.run()
	return s, nil
}

// Port is the loopback port the server listens on.
func (s *Server) Port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// Done is closed when the session has ended, well or not.
func (s *Server) Done() <-chan struct{} { return s.done }

// Err is why the session failed, once Done is closed; nil if the daemon
// closed it after it had every page.
func (s *Server) Err() error { <-s.done; return s.err }

// Stats are the pages served and requests answered so far, and how long
// the session took once Done is closed.
func (s *Server) Stats() (pages, requests int64, took time.Duration) {
	select {
	case <-s.done:
		took = s.ended.Sub(s.started)
	default:
		took = time.Since(s.started)
	}
	return s.pages.Load(), s.requests.Load(), took
}

// Close stops the server; a session under way fails.
func (s *Server) Close() {
	s.cancel()
	s.ln.Close()
	<-s.done
}

func (s *Server) run() {
	defer close(s.done)
	defer func() { s.ended = time.Now() }()
	conn, err := s.accept()
	s.ln.Close()
	if err != nil {
		s.err = fmt.Errorf("page server: %w", err)
		return
	}
	stop := context.AfterFunc(s.ctx, func() { conn.Close() })
	defer stop()
	defer conn.Close()
	s.err = s.serve(conn)
}

// accept returns the first connection of a process of this server's own
// user (the daemon, which runs as root): a loopback port is open to every
// local user, and one who connected first would otherwise take the
// daemon's place, and could read the job's memory. Others are hung up on.
func (s *Server) accept() (net.Conn, error) {
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return nil, err
		}
		uid, err := peerUID(conn)
		if err == nil && uid == os.Geteuid() {
			return conn, nil
		}
		s.log.Warn("page server: a connection of another user refused", "peer", conn.RemoteAddr().String(), "uid", uid, "err", err)
		conn.Close()
	}
}

// peerUID returns the user owning the other end of a TCP connection on
// loopback, as the kernel lists its socket (/proc/net/tcp of this
// network namespace).
func peerUID(conn net.Conn) (int, error) {
	remote, ok1 := conn.RemoteAddr().(*net.TCPAddr)
	local, ok2 := conn.LocalAddr().(*net.TCPAddr)
	if !ok1 || !ok2 || remote.IP.To4() == nil || local.IP.To4() == nil {
		return -1, fmt.Errorf("not a TCP connection over IPv4: %s", conn.RemoteAddr())
	}
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return -1, err
	}
	// The peer's socket: its local address is our remote one, and the
	// other way round.
	want := procAddr(remote) + " " + procAddr(local)
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 8 || f[1]+" "+f[2] != want {
			continue
		}
		return strconv.Atoi(f[7])
	}
	return -1, fmt.Errorf("no socket of %s to %s in /proc/net/tcp", remote, local)
}

// procAddr is addr as /proc/net/tcp writes it: the IPv4 address as a
// little-endian hex word, and the port.
func procAddr(addr *net.TCPAddr) string {
	ip := addr.IP.To4()
	return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], addr.Port)
}

// reply is the answer to one request, computed while the ones before it
// are written.
type reply struct {
	hdr   []byte
	pages []byte
	close bool
	err   error
	ready chan struct{}
}

func (s *Server) serve(conn net.Conn) error {
	rd := bufio.NewReaderSize(conn, 64<<10)
	// CRIU 4.2 sends 32-byte headers (nr_pages widened to 64 bits, after
	// 4 bytes of padding); earlier versions 24. A GET always asks for at
	// least one page, so the 4 bytes after cmd tell them apart.
	peek, err := rd.Peek(8)
	if err != nil {
		return fmt.Errorf("page server: first request: %w", err)
	}
	wide := binary.LittleEndian.Uint32(peek[4:]) == 0
	queue := make(chan *reply, maxInFlight)
	readErr := make(chan error, 1)
	go func() {
		defer close(queue)
		readErr <- s.readRequests(rd, wide, queue)
	}()
	bw := bufio.NewWriterSize(conn, 1<<20)
	var werr error
	for r := range queue {
		if werr != nil {
			continue // drain
		}
		<-r.ready
		if r.err != nil {
			werr = r.err
			s.cancel() // stop the requests in flight; the daemon fails
			conn.Close()
			continue
		}
		if _, err := bw.Write(r.hdr); err == nil {
			_, err = bw.Write(r.pages)
			werr = err
		} else {
			werr = err
		}
		if werr == nil {
			werr = bw.Flush() // the daemon waits for this one
		}
		if r.close && werr == nil {
			_, _ = io.Copy(io.Discard, rd) // to EOF, as CRIU's own server does
			return nil
		}
	}
	if werr != nil {
		return fmt.Errorf("page server: %w", werr)
	}
	if err := <-readErr; err != nil {
		return err
	}
	return errors.New("page server: the daemon left without closing the session")
}

// readRequests reads requests and starts answering each, in order, until
// the daemon closes the session or the connection ends.
func (s *Server) readRequests(rd *bufio.Reader, wide bool, queue chan<- *reply) error {
	size := 24
	if wide {
		size = 32
	}
	sem := make(chan struct{}, maxInFlight)
	for {
		hdr := make([]byte, size)
		if _, err := io.ReadFull(rd, hdr); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("page server: %w", err)
		}
		cmd := binary.LittleEndian.Uint32(hdr) & cmdMask
		r := &reply{ready: make(chan struct{})}
		switch cmd {
		case cmdClose, cmdForceClose:
			r.hdr, r.close = []byte{0, 0, 0, 0}, true
			close(r.ready)
			queue <- r
			return nil
		case cmdGet:
		default:
			r.err = fmt.Errorf("unknown command %#x", cmd)
			close(r.ready)
			queue <- r
			return r.err
		}
		var nr, vaddr, pid uint64
		if wide {
			nr, vaddr, pid = binary.LittleEndian.Uint64(hdr[8:]), binary.LittleEndian.Uint64(hdr[16:]), binary.LittleEndian.Uint64(hdr[24:])
		} else {
			nr, vaddr, pid = uint64(binary.LittleEndian.Uint32(hdr[4:])), binary.LittleEndian.Uint64(hdr[8:]), binary.LittleEndian.Uint64(hdr[16:])
		}
		queue <- r
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; close(r.ready) }()
			r.pages, nr, r.err = s.get(int(pid), vaddr, nr)
			if r.err != nil {
				return
			}
			// The header goes back as asked but for the command and,
			// maybe fewer, the pages.
			binary.LittleEndian.PutUint32(hdr, cmdAddF|FlagPresent<<16)
			if wide {
				binary.LittleEndian.PutUint64(hdr[8:], nr)
			} else {
				binary.LittleEndian.PutUint32(hdr[4:], uint32(nr))
			}
			r.hdr = hdr
			s.pages.Add(int64(nr))
			s.requests.Add(1)
		}()
	}
}

// get reads up to nr pages of process pid from vaddr on, within one
// pagemap entry: at least one, at most nr.
func (s *Server) get(pid int, vaddr, nr uint64) ([]byte, uint64, error) {
	pm := s.pms[pid]
	if pm == nil {
		return nil, 0, fmt.Errorf("pages of pid %d asked; the image has no such process", pid)
	}
	e, ok := pm.Find(vaddr)
	if !ok || !e.Lazy() || vaddr%PageSize != 0 || nr == 0 {
		return nil, 0, fmt.Errorf("pid %d: %d pages at %#x are not lazy pages of the image", pid, nr, vaddr)
	}
	nr = min(nr, (e.End()-vaddr)/PageSize)
	p := make([]byte, nr*PageSize)
	off := e.Off + int64(vaddr-e.Vaddr)
	if err := s.src.ReadPages(s.ctx, pm.PagesFile(), p, off); err != nil {
		return nil, 0, fmt.Errorf("pid %d: %d pages at %#x: %w", pid, nr, vaddr, err)
	}
	return p, nr, nil
}

// FileSource reads pages files from a directory: a restore whose pages
// files are all at hand (tests).
type FileSource struct{ Dir string }

func (f FileSource) ReadPages(_ context.Context, file string, p []byte, off int64) error {
	fd, err := os.Open(filepath.Join(f.Dir, filepath.Base(file)))
	if err != nil {
		return err
	}
	defer fd.Close()
	_, err = fd.ReadAt(p, off)
	return err
}
