package agent

import (
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/pty"
	"golang.org/x/term"
)

// exec runs a command in a container for a client (`cairn exec
// JOB/RANK`): its output streamed back as agentv1.ExecFrames as it comes,
// then its exit code; its standard input is the request body's when
// asked (stdin=1). A failure before the command runs is an error reply.
func (s *Server) exec(w http.ResponseWriter, r *http.Request, name string) {
	q := r.URL.Query()
	args := q["arg"]
	if len(args) == 0 {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, "exec: no command (arg=CMD&arg=ARG...)")
		return
	}
	if q.Get("tty") == "1" {
		s.execTTY(w, r, name, args)
		return
	}
	fw := newFrames(w)
	var stdin io.Reader // nil: no input
	if q.Get("stdin") == "1" {
		stdin = r.Body
	}
	code, err := s.Manager.Exec(r.Context(), name, args, stdin, fw.of(agentv1.ExecStdout), fw.of(agentv1.ExecStderr))
	s.execEnd(w, fw, name, code, err)
}

// execTTY runs a command in a container on a terminal, for a client's
// (tty=1): a pty of this node stands for the client's terminal, which
// runc joins to the command's own (Manager.ExecTTY). The request body's
// frames are the terminal's input and its new sizes; the terminal's
// output goes back as ExecStdout frames.
func (s *Server) execTTY(w http.ResponseWriter, r *http.Request, name string, args []string) {
	// Over HTTP/1.1 the body is read while the reply is written only
	// when asked (HTTP/2 always does).
	_ = http.NewResponseController(w).EnableFullDuplex()
	size, err := parseWinSize(r.URL.Query())
	if err != nil {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, err.Error())
		return
	}
	master, slave, err := pty.Open()
	if err != nil {
		failErr(w, err)
		return
	}
	defer master.Close()
	defer slave.Close()
	if err := pty.SetSize(master, size.Rows, size.Cols); err != nil {
		failErr(w, err)
		return
	}
	// Raw from the start, as the client's is: runc makes it raw too, but
	// only once it has the command's terminal, after the first output
	// may have passed.
	if _, err := term.MakeRaw(int(slave.Fd())); err != nil {
		failErr(w, err)
		return
	}
	resized := make(chan struct{}, 1)
	input := make(chan struct{}) // closed once the body is read to its end
	go func() {
		defer close(input)
		for {
			f, err := agentv1.ReadExecFrame(r.Body)
			if err != nil {
				return // the client sends no more
			}
			switch f.Kind {
			case agentv1.ExecStdin:
				if _, err := master.Write(f.Data); err != nil {
					return
				}
			case agentv1.ExecResize:
				if ws, err := agentv1.DecodeWinSize(f.Data); err == nil && pty.SetSize(master, ws.Rows, ws.Cols) == nil {
					select {
					case resized <- struct{}{}:
					default: // one is pending: runc reads the newest size
					}
				}
			}
		}
	}()
	fw := newFrames(w)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		// Until no one has the terminal open (EIO).
		_, _ = io.Copy(fw.of(agentv1.ExecStdout), master)
	}()
	code, err := s.Manager.ExecTTY(r.Context(), name, args, slave, slave, resized)
	slave.Close()
	select {
	case <-copied:
	case <-time.After(2 * time.Second): // something else holds it open
		master.Close()
		<-copied
	}
	s.execEnd(w, fw, name, code, err)
	// The client ends its input once it has the exit: the body is not
	// to be read after this returns.
	select {
	case <-input:
	case <-r.Context().Done():
	case <-time.After(5 * time.Second):
	}
}

// parseWinSize reads a terminal's size from rows= and cols= (24x80 if
// not given).
func parseWinSize(q url.Values) (agentv1.WinSize, error) {
	size := agentv1.WinSize{Rows: 24, Cols: 80}
	for key, dst := range map[string]*uint16{"rows": &size.Rows, "cols": &size.Cols} {
		if v := q.Get(key); v != "" {
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil || n == 0 {
				return size, fmt.Errorf("%s must be a number from 1 to 65535", key)
			}
			*dst = uint16(n)
		}
	}
	return size, nil
}

// execEnd ends an exec's reply: an error reply if the command never ran
// and nothing was sent, else its exit frame.
func (s *Server) execEnd(w http.ResponseWriter, fw *frames, name string, code int, err error) {
	if err != nil && !fw.begun() {
		failErr(w, err)
		// Out now: the client closes its input once it has the reply,
		// which the server waits for before it ends the request.
		_ = http.NewResponseController(w).Flush()
		return
	}
	if err != nil {
		s.Logger.Warn("exec failed after its output began", "container", name, "err", err)
		code = 255
	}
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(int32(code)))
	fw.write(agentv1.ExecExit, b[:])
}

// frames writes agentv1.ExecFrames to a streamed reply, one at a time
// (stdout and stderr come from two goroutines), each flushed at once.
type frames struct {
	mu sync.Mutex
	sw streamWriter
}

func newFrames(w http.ResponseWriter) *frames {
	return &frames{sw: streamWriter{w: w, contentType: "application/octet-stream"}}
}

func (f *frames) begun() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sw.started
}

func (f *frames) write(kind byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sw.start()
	for {
		n := min(len(p), agentv1.MaxExecFrame)
		if err := agentv1.WriteExecFrame(f.sw.w, kind, p[:n]); err != nil {
			return err
		}
		if p = p[n:]; len(p) == 0 {
			break
		}
	}
	f.sw.flush()
	return nil
}

// of is a writer of frames of one kind.
func (f *frames) of(kind byte) frameWriter { return frameWriter{f, kind} }

type frameWriter struct {
	f    *frames
	kind byte
}

func (w frameWriter) Write(p []byte) (int, error) {
	if err := w.f.write(w.kind, p); err != nil {
		return 0, err
	}
	return len(p), nil
}
