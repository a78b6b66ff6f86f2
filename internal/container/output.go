package container

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A container's output reaches its log through a pipe: the container's
// processes hold its write end as stdout and stderr, the shim reads it and
// appends to container.log. A checkpoint keeps the log up to the instant
// it froze the container, and so needs what the processes wrote before
// that instant, including what is still in the pipe or between the shim's
// read and its write. CRIU does not keep it: the container holds only the
// pipe's write end, and CRIU dumps a pipe's contents only with a read end
// (the stdout pipe gets no entry in pipes-data.img); the bytes stay in the
// old pipe, and a restore's shim makes a new, empty one.
//
// So the shim answers a flush on its control socket (shimSocket in the
// container's dir): with the container frozen nothing enters the pipe, so
// once the shim has read the pipe empty and written everything it read,
// the log's size is the exact cut. The checkpoint asks for it while the
// container is still frozen (keepOutput).

// shimSocket is the shim's control socket, in the container's dir.
const shimSocket = "shim.sock"

// flushTimeout bounds a flush in the shim (and twice it the wait of the
// checkpoint, which stalls the container meanwhile): the shim only has to
// write out what one pipe holds.
const flushTimeout = 2 * time.Second

// output copies a container's output from the pipe into its log. A flush
// is served by the copying goroutine itself (run), so that nothing read
// is ever held back from the size it reports.
type output struct {
	pipe *os.File // read end, in the runtime's poller (deadlines work)
	log  *os.File // opened for appending
	// times gets a mark for what is written to log (logtimes.go), at
	// most one a millisecond; nil: none. off is log's size.
	times     *os.File
	off, last int64
	reqs      chan chan int64
	done      chan struct{} // closed once the pipe is at its end
	end       int64         // the log's size then
}

func newOutput(pipe, log, times *os.File) *output {
	o := &output{pipe: pipe, log: log, times: times, reqs: make(chan chan int64, 16), done: make(chan struct{})}
	o.off = o.size()
	return o
}

// run copies until every writer of the pipe is gone. A write to the log
// that fails drops that output rather than stop reading: the container
// must never block on a full pipe.
func (o *output) run() {
	buf := make([]byte, 64<<10)
	for {
		n, err := o.pipe.Read(buf)
		o.write(buf[:n])
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// A flush woke us (flush sets the deadline after queueing).
			_ = o.pipe.SetReadDeadline(time.Time{})
			o.drain(buf)
			o.answer(o.size())
			continue
		}
		if err != nil {
			o.end = o.size()
			o.answer(o.end)
			close(o.done)
			return
		}
	}
}

func (o *output) write(b []byte) {
	if len(b) == 0 {
		return
	}
	if now := time.Now().UnixNano(); o.times != nil && now-o.last >= markEvery {
		if _, err := o.times.Write(mark{o.off, now}.encode()); err == nil {
			o.last = now
		}
	}
	n, _ := o.log.Write(b)
	o.off += int64(n)
}

// drain copies what the pipe holds now without waiting for more.
func (o *output) drain(buf []byte) {
	rc, err := o.pipe.SyscallConn()
	if err != nil {
		return
	}
	for {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, rerr = unix.Read(int(fd), buf)
			return true // never wait: an empty pipe ends the drain
		}); err != nil {
			return
		}
		if errors.Is(rerr, unix.EINTR) {
			continue
		}
		if rerr != nil || n <= 0 {
			return
		}
		o.write(buf[:n])
	}
}

// answer replies to every queued flush.
func (o *output) answer(size int64) {
	for {
		select {
		case r := <-o.reqs:
			r <- size
		default:
			return
		}
	}
}

func (o *output) size() int64 {
	fi, err := o.log.Stat()
	if err != nil {
		return 0
	}
	return fi.Size()
}

// flush waits until everything in the pipe now is in the log and returns
// the log's size.
func (o *output) flush(timeout time.Duration) (int64, error) {
	expired := time.After(timeout)
	reply := make(chan int64, 1)
	select {
	case o.reqs <- reply:
	case <-o.done:
		return o.end, nil
	case <-expired:
		return 0, errors.New("output flush timed out")
	}
	// Wake run out of its read; it answers every queued flush.
	if err := o.pipe.SetReadDeadline(time.Now()); err != nil {
		return 0, err
	}
	select {
	case n := <-reply:
		return n, nil
	case <-o.done:
		return o.end, nil
	case <-expired:
		return 0, errors.New("output flush timed out")
	}
}

// serveControl answers requests on the shim's control socket until ln is
// closed. A request is one line: "flush" is answered "ok SIZE" once what
// the container wrote so far is in the log, SIZE the log's size then.
func serveControl(ln net.Listener, o *output) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(2 * flushTimeout))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return
			}
			switch req := strings.TrimSpace(line); req {
			case "flush":
				n, err := o.flush(flushTimeout)
				if err != nil {
					fmt.Fprintf(c, "err %v\n", err)
					return
				}
				fmt.Fprintf(c, "ok %d\n", n)
			default:
				fmt.Fprintf(c, "err unknown request %q\n", req)
			}
		}()
	}
}

// inDir calls f with a name of dir/base short enough for a unix socket
// address whatever dir's length: through an O_PATH descriptor of dir.
func inDir(dir, base string, f func(addr string) error) error {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(fd)
	return f(fmt.Sprintf("/proc/self/fd/%d/%s", fd, base))
}

// control is a shim's control socket.
type control struct {
	net.Listener
	path string
	file os.FileInfo // the socket file it made
}

// listenControl opens the shim's control socket at path (a stale one of
// an earlier shim is replaced).
func listenControl(path string) (*control, error) {
	_ = os.Remove(path)
	var ln net.Listener
	err := inDir(filepath.Dir(path), filepath.Base(path), func(addr string) (err error) {
		ln, err = net.Listen("unix", addr)
		return err
	})
	if err != nil {
		return nil, err
	}
	// Its address names a descriptor closed since: the file is removed by
	// path (close), not by that name.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	fi, err := os.Lstat(path)
	if err != nil {
		ln.Close()
		return nil, err
	}
	return &control{Listener: ln, path: path, file: fi}, nil
}

// close stops serving and removes the socket file, unless a later shim
// of the container has made its own there meanwhile.
func (c *control) close() {
	c.Listener.Close()
	if fi, err := os.Lstat(c.path); err == nil && os.SameFile(fi, c.file) {
		os.Remove(c.path)
	}
}

// flushOutput asks the shim of the container in dir to write everything
// the container has printed into its log, and returns the log's size.
func flushOutput(ctx context.Context, dir string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*flushTimeout)
	defer cancel()
	var c net.Conn
	err := inDir(dir, shimSocket, func(addr string) (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, "unix", addr)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("reach the shim: %w", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte("flush\n")); err != nil {
		return 0, fmt.Errorf("ask the shim to flush: %w", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("flush: %w", err)
	}
	line = strings.TrimSpace(line)
	if msg, ok := strings.CutPrefix(line, "err "); ok {
		return 0, fmt.Errorf("flush: %s", msg)
	}
	n, err := strconv.ParseInt(strings.TrimPrefix(line, "ok "), 10, 64)
	if err != nil || !strings.HasPrefix(line, "ok ") || n < 0 {
		return 0, fmt.Errorf("flush: the shim answered %q", line)
	}
	return n, nil
}
