package agent

import (
	"encoding/binary"
	"io"
	"net/http"
	"sync"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
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
	fw := &frames{w: w}
	var stdin io.Reader // nil: no input
	if q.Get("stdin") == "1" {
		stdin = r.Body
	}
	code, err := s.Manager.Exec(r.Context(), name, args, stdin, fw.of(agentv1.ExecStdout), fw.of(agentv1.ExecStderr))
	if err != nil && !fw.begun() {
		failErr(w, err)
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

// frames writes agentv1.ExecFrames to a reply, one at a time (stdout and
// stderr come from two goroutines), flushed at once; the reply's header
// goes out with the first.
type frames struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	started bool
}

func (f *frames) begun() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started
}

func (f *frames) write(kind byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.started {
		f.w.Header().Set("Content-Type", "application/octet-stream")
		f.w.WriteHeader(http.StatusOK)
		f.started = true
	}
	for {
		n := min(len(p), agentv1.MaxExecFrame)
		if err := agentv1.WriteExecFrame(f.w, kind, p[:n]); err != nil {
			return err
		}
		if p = p[n:]; len(p) == 0 {
			break
		}
	}
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
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
