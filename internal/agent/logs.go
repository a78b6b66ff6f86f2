// A container's output and its incarnations, streamed to the CLI.

package agent

import (
	"net/http"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
)

// logs streams a container's output as the query (agentv1.LogQuery)
// asks: its current incarnation's or an earlier one's; with follow
// (current only) until it exits.
func (s *Server) logs(w http.ResponseWriter, r *http.Request, name string) {
	q, err := agentv1.ParseLogQuery(r.URL.Query())
	if err != nil {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, err.Error())
		return
	}
	out := &streamWriter{w: w, contentType: "text/plain"}
	err = s.Manager.CopyLog(r.Context(), out, name, container.LogOptions{
		Incarnation: q.Incarnation, Follow: q.Follow, Timestamps: q.Timestamps, Since: q.Since})
	if err != nil && !out.started {
		failErr(w, err)
		return
	}
	out.start() // an empty log is an empty answer
}

// streamWriter is a streamed reply: 200 and its header go out with its
// first write (or start), and every write is flushed to the client as it
// comes.
type streamWriter struct {
	w           http.ResponseWriter
	contentType string
	started     bool
}

func (sw *streamWriter) start() {
	if !sw.started {
		sw.w.Header().Set("Content-Type", sw.contentType)
		sw.w.WriteHeader(http.StatusOK)
		sw.started = true
	}
}

func (sw *streamWriter) Write(p []byte) (int, error) {
	sw.start()
	n, err := sw.w.Write(p)
	sw.flush()
	return n, err
}

func (sw *streamWriter) flush() {
	if fl, ok := sw.w.(http.Flusher); ok {
		fl.Flush()
	}
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
