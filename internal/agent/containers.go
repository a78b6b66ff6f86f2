// A node's containers, served to the CLI.

package agent

import (
	"encoding/json"
	"net/http"
	"strconv"
	"syscall"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
)

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	h := agentv1.Health{Node: s.Creds.Name, Cluster: s.Creds.ClusterID, Version: "v1"}
	if info, err := s.Manager.CRIU(r.Context()); err != nil {
		h.CRIUError = err.Error()
	} else {
		h.CRIU = info.Version.String()
	}
	writeJSON(w, http.StatusOK, h)
}

func (s *Server) listContainers(w http.ResponseWriter, r *http.Request) {
	list, err := s.Manager.List(r.Context())
	if err != nil {
		failErr(w, err)
		return
	}
	out := []agentv1.Container{}
	for _, in := range list {
		out = append(out, toWire(in))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) runContainer(w http.ResponseWriter, r *http.Request) {
	var req agentv1.RunRequest
	if !decode(w, r, &req) {
		return
	}
	if err := container.ValidName(req.Name); err != nil {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, err.Error())
		return
	}
	in, err := s.Manager.Run(r.Context(), container.Config{Name: req.Name, Args: req.Args, Env: req.Env, RootFS: req.RootFS, Hostname: req.Hostname, Cwd: req.Cwd})
	if err != nil {
		failErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, toWire(in))
}

func (s *Server) getContainer(w http.ResponseWriter, r *http.Request, name string) {
	in, err := s.Manager.Get(r.Context(), name)
	if err != nil {
		failErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toWire(in))
}

func (s *Server) removeContainer(w http.ResponseWriter, r *http.Request, name string) {
	if err := s.Manager.Remove(r.Context(), name, r.URL.Query().Get("force") == "1"); err != nil {
		failErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) checkpoint(w http.ResponseWriter, r *http.Request) {
	var req agentv1.CheckpointRequest
	if !decode(w, r, &req) {
		return
	}
	rec, err := s.Manager.Checkpoint(r.Context(), req.Name, container.CheckpointOptions{Stop: req.Stop})
	if err != nil {
		failErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, checkpointWire(rec))
}

func (s *Server) restore(w http.ResponseWriter, r *http.Request) {
	var req agentv1.RestoreRequest
	if !decode(w, r, &req) {
		return
	}
	in, err := s.Manager.Restore(r.Context(), req.Name, container.RestoreOptions{Seq: req.Seq, As: req.As})
	if err != nil {
		failErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toWire(in))
}

func (s *Server) checkpoints(w http.ResponseWriter, r *http.Request) {
	recs, err := s.Manager.Checkpoints(r.URL.Query().Get("container"))
	if err != nil {
		failErr(w, err)
		return
	}
	out := []agentv1.Checkpoint{}
	for _, rec := range recs {
		out = append(out, checkpointWire(rec))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	sig, err := strconv.Atoi(r.URL.Query().Get("signal"))
	if err != nil || sig <= 0 || sig > 64 || container.ValidName(name) != nil {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, "kill needs a container name and ?signal=N")
		return
	}
	if err := s.Manager.Kill(r.Context(), name, syscall.Signal(sig)); err != nil {
		failErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func toWire(in *container.Info) agentv1.Container {
	c := agentv1.Container{Name: in.Name, Status: agentv1.Status(in.Status), Pid: in.Pid, Addr: in.Addr.String(),
		Args: in.Config.Args, Created: in.Created, RestoredFrom: in.RestoredFrom}
	if in.Exit != nil {
		code := in.Exit.Code
		c.ExitCode, c.EndedBy = &code, in.Exit.Reason
	}
	return c
}

func checkpointWire(rec *image.Record) agentv1.Checkpoint {
	raw, _ := json.Marshal(rec)
	return agentv1.Checkpoint{Container: rec.Container, Seq: rec.Seq, Created: rec.Created, Size: rec.Size(),
		NewBytes: rec.NewBytes, Stall: rec.Timing.Stall, Total: rec.Timing.Total, Pinned: rec.Pinned, Record: raw}
}
