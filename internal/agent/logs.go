// A container's output and its incarnations, streamed to the CLI.

package agent

import (
	"io"
	"net/http"
	"os"
	"strconv"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
)

// logs streams a container's output: its current incarnation's, or with
// incarnation=N that incarnation's; with follow=1 (current only) until it
// exits.
func (s *Server) logs(w http.ResponseWriter, r *http.Request, name string) {
	q := r.URL.Query()
	n := 0
	if v := q.Get("incarnation"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, "incarnation must be a number from 1")
			return
		}
	}
	follow := q.Get("follow") == "1"
	path, err := s.Manager.IncarnationLog(name, n)
	if err != nil {
		failErr(w, err)
		return
	}
	if cur, err := s.Manager.IncarnationLog(name, 0); err != nil || cur != path {
		follow = false // an earlier incarnation's log is complete
	}
	f, err := os.Open(path)
	if err != nil {
		failErr(w, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			continue
		}
		if err != nil && err != io.EOF {
			return
		}
		if fl != nil {
			fl.Flush()
		}
		if !follow {
			return
		}
		if in, err := s.Manager.Get(r.Context(), name); err != nil || !in.Status.Active() || !isFile(f, path) {
			// One more read for what was written before the exit (or
			// before a restore made a new incarnation).
			if n, _ := f.Read(buf); n > 0 {
				_, _ = w.Write(buf[:n])
				continue
			}
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// isFile reports whether path still names the open file f.
func isFile(f *os.File, path string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(path)
	return err1 != nil || err2 != nil || os.SameFile(a, b)
}

// incarnations lists a container's incarnations on this node.
func (s *Server) incarnations(w http.ResponseWriter, _ *http.Request, name string) {
	incs, err := s.Manager.Incarnations(name)
	if err != nil {
		failErr(w, err)
		return
	}
	out := make([]agentv1.Incarnation, len(incs))
	for i, inc := range incs {
		out[i] = IncarnationWire(inc)
	}
	writeJSON(w, http.StatusOK, out)
}

// IncarnationWire is an incarnation as the API shows it.
func IncarnationWire(inc container.Incarnation) agentv1.Incarnation {
	out := agentv1.Incarnation{
		N: inc.N, Started: inc.Started, RestoredFrom: inc.RestoredFrom, Restored: inc.Restored,
		Checkpointed: inc.Checkpointed, Current: inc.Current, Bytes: inc.Bytes,
	}
	if e := inc.Exit; e != nil {
		code := e.Code
		out.Ended, out.ExitCode, out.Signal = e.Time, &code, e.Signal
	}
	return out
}
