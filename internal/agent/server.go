package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"

	agentv1 "cairn/api/agent/v1"
	"cairn/internal/container"
	"cairn/internal/criu"
	"cairn/internal/image"
	"cairn/internal/names"
	"cairn/internal/netw"
	"cairn/internal/pki"
	"cairn/internal/rpc"
)

// Server serves one node's Manager over the agent API.
type Server struct {
	Manager *container.Manager
	Creds   *pki.Credentials
	Logger  *slog.Logger
	Node    Node // for job networks
	// Tools is this node's tools dir (launch.InstallTools), mounted in
	// ranks that ask for it; "" refuses them.
	Tools string

	once    sync.Once // makes part, on the first request
	part    *participant
	netMu   sync.Mutex // job network changes on this node
	sources chunkSources
	fetches fetches
}

func (s *Server) log() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

// Serve accepts connections on ln (TLS is added here) until ctx is done.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	err := rpc.Serve(ctx, ln, s, s.Creds, s.Logger)
	s.sources.closeAll()
	return err
}

func writeJSON(w http.ResponseWriter, status int, v any) { rpc.WriteJSON(w, status, v) }

func fail(w http.ResponseWriter, status int, code, msg string) { rpc.Fail(w, status, code, msg) }

func decode(w http.ResponseWriter, r *http.Request, v any) bool { return rpc.Decode(w, r, v) }

// failErr maps a Manager error to the wire: this is the API boundary.
func failErr(w http.ResponseWriter, err error) {
	var we *agentv1.Error
	switch {
	case errors.As(err, &we):
		rpc.FailError(w, we)
	case errors.Is(err, names.ErrInvalid), errors.Is(err, container.ErrBadConfig):
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, err.Error())
	case errors.Is(err, container.ErrNotFound), errors.Is(err, image.ErrNotFound):
		fail(w, http.StatusNotFound, agentv1.CodeNotFound, err.Error())
	case errors.Is(err, container.ErrExists):
		fail(w, http.StatusConflict, agentv1.CodeExists, err.Error())
	case errors.Is(err, container.ErrRunning):
		fail(w, http.StatusConflict, agentv1.CodeRunning, err.Error())
	case errors.Is(err, container.ErrNotRunning):
		fail(w, http.StatusConflict, agentv1.CodeNotRunning, err.Error())
	case errors.Is(err, image.ErrCorrupt):
		fail(w, http.StatusUnprocessableEntity, agentv1.CodeCorrupt, err.Error())
	case errors.Is(err, criu.ErrUnusable):
		fail(w, http.StatusServiceUnavailable, agentv1.CodeCRIU, err.Error())
	case errors.Is(err, container.ErrDamaged):
		fail(w, http.StatusInternalServerError, agentv1.CodeDamaged, err.Error())
	case errors.Is(err, container.ErrDumpFailed):
		fail(w, http.StatusInternalServerError, agentv1.CodeDumpFailed, err.Error())
	default:
		fail(w, http.StatusInternalServerError, agentv1.CodeInternal, err.Error())
	}
}

// ServeHTTP authenticates the caller and routes the request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.once.Do(func() { s.part = newParticipant(managerRanks{s.Manager}, s.log()) })
	id, ok := rpc.Caller(w, r)
	if !ok {
		return
	}
	// Other agents may only read images (to fetch a rank's image to their
	// node); everything else is for the coordinator and clients.
	imageRead := r.URL.Path == agentv1.PathExport || r.URL.Path == agentv1.PathChunks || r.URL.Path == agentv1.PathExportDelta || r.URL.Path == agentv1.PathChunkData || r.URL.Path == agentv1.PathStaged
	if id.Role != pki.Coordinator && id.Role != pki.Client && !(id.Role == pki.Agent && imageRead) {
		fail(w, http.StatusForbidden, agentv1.CodeForbidden, fmt.Sprintf("%s %s may not call %s on an agent", id.Role, id.Name, r.URL.Path))
		return
	}
	ctx := r.Context()
	m := s.Manager
	switch {
	case r.URL.Path == agentv1.PathHealth && r.Method == http.MethodGet:
		h := agentv1.Health{Node: s.Creds.Name, Cluster: s.Creds.ClusterID, Version: "v1"}
		if info, err := m.CRIU(ctx); err != nil {
			h.CRIUError = err.Error()
		} else {
			h.CRIU = info.Version.String()
		}
		writeJSON(w, http.StatusOK, h)
	case r.URL.Path == agentv1.PathContainers && r.Method == http.MethodGet:
		list, err := m.List(ctx)
		if err != nil {
			failErr(w, err)
			return
		}
		out := []agentv1.Container{}
		for _, in := range list {
			out = append(out, toWire(in))
		}
		writeJSON(w, http.StatusOK, out)
	case r.URL.Path == agentv1.PathContainers && r.Method == http.MethodPost:
		var req agentv1.RunRequest
		if !decode(w, r, &req) {
			return
		}
		if err := container.ValidName(req.Name); err != nil {
			fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, err.Error())
			return
		}
		in, err := m.Run(ctx, container.Config{Name: req.Name, Args: req.Args, Env: req.Env, RootFS: req.RootFS, Hostname: req.Hostname, Cwd: req.Cwd})
		if err != nil {
			failErr(w, err)
			return
		}
		writeJSON(w, http.StatusCreated, toWire(in))
	case strings.HasPrefix(r.URL.Path, agentv1.PathContainer) && (r.Method == http.MethodGet || r.Method == http.MethodDelete):
		name := strings.TrimPrefix(r.URL.Path, agentv1.PathContainer)
		if err := container.ValidName(name); err != nil {
			fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, err.Error())
			return
		}
		if r.Method == http.MethodDelete {
			if err := m.Remove(ctx, name, r.URL.Query().Get("force") == "1"); err != nil {
				failErr(w, err)
				return
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		in, err := m.Get(ctx, name)
		if err != nil {
			failErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, toWire(in))
	case r.URL.Path == agentv1.PathCheckpoint && r.Method == http.MethodPost:
		var req agentv1.CheckpointRequest
		if !decode(w, r, &req) {
			return
		}
		rec, err := m.Checkpoint(ctx, req.Name, container.CheckpointOptions{Stop: req.Stop})
		if err != nil {
			failErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, checkpointWire(rec))
	case r.URL.Path == agentv1.PathRestore && r.Method == http.MethodPost:
		var req agentv1.RestoreRequest
		if !decode(w, r, &req) {
			return
		}
		in, err := m.Restore(ctx, req.Name, container.RestoreOptions{Seq: req.Seq, As: req.As})
		if err != nil {
			failErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, toWire(in))
	case r.URL.Path == agentv1.PathCheckpoints && r.Method == http.MethodGet:
		recs, err := m.Checkpoints(r.URL.Query().Get("container"))
		if err != nil {
			failErr(w, err)
			return
		}
		out := []agentv1.Checkpoint{}
		for _, rec := range recs {
			out = append(out, checkpointWire(rec))
		}
		writeJSON(w, http.StatusOK, out)
	case r.URL.Path == agentv1.PathJobNet && r.Method == http.MethodPut:
		var req agentv1.JobNet
		if !decode(w, r, &req) {
			return
		}
		if _, err := s.ensureJobNet(ctx, req); err != nil {
			failErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.URL.Path == agentv1.PathJobNet && r.Method == http.MethodDelete:
		vni, err := strconv.ParseUint(r.URL.Query().Get("vni"), 10, 24)
		if err != nil {
			fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, "?vni=N required")
			return
		}
		n := netw.NodeJobNet{Local: s.Node.Underlay, Dev: s.Node.Dev, VNI: uint32(vni), Prefix: s.Node.NetnsPrefix}
		if err := n.Delete(ctx); err != nil {
			failErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.URL.Path == agentv1.PathRankRun && r.Method == http.MethodPost:
		var req agentv1.RankRun
		if !decode(w, r, &req) {
			return
		}
		in, err := s.rankRun(ctx, req)
		if err != nil {
			failErr(w, err)
			return
		}
		writeJSON(w, http.StatusCreated, toWire(in))
	case r.URL.Path == agentv1.PathRankRestore && r.Method == http.MethodPost:
		var req agentv1.RankRestore
		if !decode(w, r, &req) {
			return
		}
		in, err := s.rankRestore(ctx, req, "", nil)
		if err != nil {
			failErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, toWire(in))
	case r.URL.Path == agentv1.PathRankResume && r.Method == http.MethodPost:
		var req agentv1.RankResume
		if !decode(w, r, &req) {
			return
		}
		if err := s.rankResume(ctx, req); err != nil {
			failErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.URL.Path == agentv1.PathRankRemove && r.Method == http.MethodPost:
		var req agentv1.RankRemove
		if !decode(w, r, &req) {
			return
		}
		if err := s.rankRemove(ctx, req); err != nil {
			failErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.URL.Path == agentv1.PathDropImages && r.Method == http.MethodPost:
		var req agentv1.DropImages
		if !decode(w, r, &req) {
			return
		}
		out, err := s.dropImages(req)
		if err != nil {
			failErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, out)
	case r.URL.Path == agentv1.PathRankStall && r.Method == http.MethodPost:
		var req agentv1.RankStall
		if !decode(w, r, &req) {
			return
		}
		if err := s.rankStall(ctx, req); err != nil {
			failErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.URL.Path == agentv1.PathStaged && r.Method == http.MethodGet:
		s.staged(w, r)
	case r.URL.Path == agentv1.PathMigrateIn && r.Method == http.MethodPost:
		var req agentv1.MigrateIn
		if !decode(w, r, &req) {
			return
		}
		out, err := s.migrateIn(ctx, req)
		if err != nil {
			failErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, out)
	case r.URL.Path == agentv1.PathMigrateOut && r.Method == http.MethodPost:
		var req agentv1.MigrateOut
		if !decode(w, r, &req) {
			return
		}
		if err := s.migrateOut(ctx, req); err != nil {
			failErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.URL.Path == agentv1.PathPrepare && r.Method == http.MethodPost:
		var req agentv1.Prepare
		if !decode(w, r, &req) {
			return
		}
		out, err := s.prepare(ctx, req)
		if err != nil {
			failErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, out)
	case (r.URL.Path == agentv1.PathCommit || r.URL.Path == agentv1.PathAbort) && r.Method == http.MethodPost:
		var req agentv1.Finish
		if !decode(w, r, &req) {
			return
		}
		if r.URL.Path == agentv1.PathAbort {
			if err := s.abort(ctx, req); err != nil {
				failErr(w, err)
				return
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		out, err := s.commit(ctx, req)
		if err != nil {
			failErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, out)
	case r.URL.Path == agentv1.PathFetch && r.Method == http.MethodPost:
		var req agentv1.Fetch
		if !decode(w, r, &req) {
			return
		}
		out, err := s.fetch(ctx, req)
		if err != nil {
			failErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, out)
	case r.URL.Path == agentv1.PathExport && r.Method == http.MethodGet:
		s.export(w, r)
	case r.URL.Path == agentv1.PathChunks && r.Method == http.MethodGet:
		s.chunks(w, r)
	case r.URL.Path == agentv1.PathExportDelta && r.Method == http.MethodPost:
		s.exportDelta(w, r)
	case r.URL.Path == agentv1.PathChunkData && r.Method == http.MethodPost:
		s.chunkData(w, r)
	case strings.HasPrefix(r.URL.Path, agentv1.PathLogs) && r.Method == http.MethodGet:
		name := strings.TrimPrefix(r.URL.Path, agentv1.PathLogs)
		if err := container.ValidName(name); err != nil {
			fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, err.Error())
			return
		}
		s.logs(w, r, name)
	case strings.HasPrefix(r.URL.Path, agentv1.PathIncarnations) && r.Method == http.MethodGet:
		name := strings.TrimPrefix(r.URL.Path, agentv1.PathIncarnations)
		if err := container.ValidName(name); err != nil {
			fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, err.Error())
			return
		}
		s.incarnations(w, name)
	case strings.HasPrefix(r.URL.Path, agentv1.PathKill) && r.Method == http.MethodPost:
		name := strings.TrimPrefix(r.URL.Path, agentv1.PathKill)
		sig, err := strconv.Atoi(r.URL.Query().Get("signal"))
		if err != nil || sig <= 0 || sig > 64 || container.ValidName(name) != nil {
			fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, "kill needs a container name and ?signal=N")
			return
		}
		if err := m.Kill(ctx, name, syscall.Signal(sig)); err != nil {
			failErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		fail(w, http.StatusNotFound, agentv1.CodeNotFound, r.Method+" "+r.URL.Path+" is not in the agent API")
	}
}

func toWire(in *container.Info) agentv1.Container {
	c := agentv1.Container{Name: in.Name, Status: in.Status, Pid: in.Pid, Addr: in.Addr.String(),
		Args: in.Config.Args, Created: in.Created, RestoredFrom: in.RestoredFrom}
	if in.Exit != nil {
		code := in.Exit.Code
		c.ExitCode = &code
	}
	return c
}

func checkpointWire(rec *image.Record) agentv1.Checkpoint {
	raw, _ := json.Marshal(rec)
	return agentv1.Checkpoint{Container: rec.Container, Seq: rec.Seq, Created: rec.Created, Size: rec.Size(),
		NewBytes: rec.NewBytes, Stall: rec.Timing.Stall, Total: rec.Timing.Total, Pinned: rec.Pinned, Record: raw}
}
