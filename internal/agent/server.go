package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/criu"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/metrics"
	"github.com/cairn-hpc/cairn/internal/names"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
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
	// Coord is the coordinator the rank API forwards ranks' requests to;
	// nil when the node is in no cluster.
	Coord RankCoordinator
	// Metrics, if set, are served at GET /metrics to the coordinator and
	// clients, and to a caller without a certificate that has
	// MetricsToken.
	Metrics      *metrics.Node
	MetricsToken metrics.Token

	once    sync.Once // makes api, part and eps, on first use
	api     *api
	part    *participant
	eps     *endpoints
	scrape  http.Handler // serves Metrics
	netMu   sync.Mutex   // job network changes on this node
	sources chunkSources
	donors  donors // pages of post-copy migrations' staged images (donor.go)
	fetches fetches
	reclaim reclaimer
}

func (s *Server) log() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

// Serve accepts connections on ln (TLS is added here) until ctx is done.
// First it serves again the rank API of every rank on this node (an
// earlier agent served it).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.init()
	s.openRankAPIs(ctx)
	conf := pki.ServerConfig(s.Creds)
	if len(s.MetricsToken) > 0 {
		conf = pki.ServerConfigOptionalCert(s.Creds) // ServeHTTP refuses all but a scrape with the token
	}
	err := rpc.ServeTLS(ctx, ln, s, conf, s.Logger)
	s.sources.closeAll()
	return err
}

func (s *Server) init() {
	s.once.Do(func() {
		s.eps = newEndpoints(s.apiDir, s.rankSelf, func() RankCoordinator { return s.Coord }, s.log())
		s.api = newAPI(s.routes(), s.log())
		if s.Manager != nil {
			s.api.fence = newFence(s.Manager.DataDir())
		}
		s.part = newParticipant(managerRanks{m: s.Manager, eps: s.eps}, s.log())
		if s.Metrics != nil {
			s.scrape = metrics.Handler(s.Metrics)
		}
	})
}

// ServeHTTP authenticates the caller (by its certificate, or a scrape of
// /metrics by the read-only token) and routes the request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.init()
	if s.scrape != nil && s.MetricsToken.Allows(r) {
		s.scrape.ServeHTTP(w, r) // the read-only token, with or without a certificate
		return
	}
	s.api.ServeHTTP(w, r)
}

// route is one operation of the agent API.
type route struct {
	method string
	path   string // an http.ServeMux path pattern: {name...} is a container
	// agents: other agents may call it too. They may only read images,
	// to fetch a rank's image to their node; every other operation is
	// for the coordinator and clients.
	agents bool
	serve  http.HandlerFunc
}

func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) { rt.serve(w, r) }

// named is the path pattern of an operation on container NAME: path +
// NAME. The name may hold slashes (escaped or not) so that every name
// reaches the operation, which refuses a bad one as a bad request.
func named(path string) string { return path + "{name...}" }

// routes is the agent API.
func (s *Server) routes() []route {
	const get, post, put, del = http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete
	return []route{
		// method, path, other agents may call it, operation
		// Containers (cairn CLI), containers.go.
		{get, agentv1.PathHealth, false, s.health},
		{get, agentv1.PathContainers, false, s.listContainers},
		{post, agentv1.PathContainers, false, s.runContainer},
		{get, named(agentv1.PathContainer), false, withName(s.getContainer)},
		{del, named(agentv1.PathContainer), false, withName(s.removeContainer)},
		{post, agentv1.PathCheckpoint, false, s.checkpoint},
		{post, agentv1.PathRestore, false, s.restore},
		{get, agentv1.PathCheckpoints, false, s.checkpoints},
		{post, named(agentv1.PathKill), false, s.kill},
		{get, named(agentv1.PathLogs), false, withName(s.logs)},
		{get, named(agentv1.PathIncarnations), false, withName(s.incarnations)},
		{post, named(agentv1.PathExec), false, withName(s.exec)},

		// Job networks and ranks (coordinator), ranks.go.
		{put, agentv1.PathJobNet, false, do(s.putJobNet)},
		{del, agentv1.PathJobNet, false, s.deleteJobNet},
		{post, agentv1.PathRankRun, false, call(http.StatusCreated, s.rankRunWire)},
		{post, agentv1.PathRankRestore, false, call(http.StatusOK, s.rankRestoreWire)},
		{post, agentv1.PathRankResume, false, do(s.rankResume)},
		{post, agentv1.PathRankRemove, false, do(s.rankRemove)},

		// Global checkpoints (coordinator), ranks.go and participant.go.
		{post, agentv1.PathPrepare, false, call(http.StatusOK, s.prepare)},
		{post, agentv1.PathCommit, false, call(http.StatusOK, s.commit)},
		{post, agentv1.PathAbort, false, do(s.abort)},

		// Migrations (coordinator; the target node reads the staged
		// image), migrate.go.
		{post, agentv1.PathRankStall, false, do(s.rankStall)},
		{get, agentv1.PathStaged, true, s.staged},
		{post, agentv1.PathMigrateIn, false, call(http.StatusOK, s.migrateIn)},
		{post, agentv1.PathMigrateOut, false, do(s.migrateOut)},
		{post, agentv1.PathStagedPages, true, s.stagedPages},
		{post, agentv1.PathStagedDone, true, s.stagedDone},

		// Images: fetched from other agents (fetch.go), served to them
		// and the CLI (transfer.go), dropped.
		{post, agentv1.PathFetch, false, call(http.StatusOK, s.fetch)},
		{get, agentv1.PathExport, true, s.export},
		{get, agentv1.PathChunks, true, s.chunks},
		{post, agentv1.PathExportDelta, true, s.exportDelta},
		{post, agentv1.PathChunkData, true, s.chunkData},
		{post, agentv1.PathDropImages, false, call(http.StatusOK, s.dropImages)},

		// The durable tier (coordinator), tier.go.
		{post, agentv1.PathTierFlush, false, call(http.StatusOK, s.tierFlush)},
		{post, agentv1.PathTierFetch, false, call(http.StatusOK, s.tierFetch)},
		{post, agentv1.PathTierRecord, false, do(s.tierRecord)},
		{post, agentv1.PathTierRead, false, call(http.StatusOK, s.tierRead)},
		{post, agentv1.PathTierPrune, false, call(http.StatusOK, s.tierPrune)},

		// The node's metrics, metrics.go.
		{get, metrics.Path, false, s.serveMetrics},
	}
}

// api routes requests to the agent API's operations, once the caller's
// role allows them.
type api struct {
	mux    *http.ServeMux
	agents map[string]bool // paths other agents may call
	fence  *fence          // admits coordinators by their term
	log    *slog.Logger
}

func newAPI(routes []route, log *slog.Logger) *api {
	a := &api{mux: http.NewServeMux(), agents: map[string]bool{}, fence: newFence(""), log: log}
	for i := range routes {
		rt := &routes[i]
		a.mux.Handle(rt.method+" "+rt.path, rt)
		if rt.agents {
			a.agents[rt.path] = true
		}
	}
	return a
}

// ServeHTTP answers 401 to a caller without credentials of the cluster,
// 403 to an agent calling a path no agent may call (whatever the method),
// and 404 to a method and path not in the API.
func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, ok := rpc.Caller(w, r)
	if !ok {
		return
	}
	if id.Role != pki.Coordinator && id.Role != pki.Client && !(id.Role == pki.Agent && a.agents[r.URL.Path]) {
		fail(w, http.StatusForbidden, agentv1.CodeForbidden, fmt.Sprintf("%s %s may not call %s on an agent", id.Role, id.Name, r.URL.Path))
		return
	}
	if id.Role == pki.Coordinator {
		var term agentv1.Term
		if h := r.Header.Get(agentv1.TermHeader); h != "" {
			t, err := agentv1.ParseTerm(h)
			if err != nil {
				fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, agentv1.TermHeader+": "+err.Error())
				return
			}
			term = t
		}
		if err := a.fence.admit(term); errors.Is(err, errStaleTerm) {
			a.log.Warn("refused a call of a replaced coordinator", "call", r.Method+" "+r.URL.Path, "term", term.String(), "err", err)
			fail(w, http.StatusConflict, agentv1.CodeStaleTerm, err.Error())
			return
		} else if err != nil {
			fail(w, http.StatusInternalServerError, agentv1.CodeInternal, err.Error())
			return
		}
	}
	r = asSent(r)
	// What ServeMux answers itself (405 for another method, a redirect to
	// the path with a trailing slash) is not in the API, nor is HEAD for
	// GET.
	if h, _ := a.mux.Handler(r); !isRoute(h, r.Method) {
		fail(w, http.StatusNotFound, agentv1.CodeNotFound, r.Method+" "+r.URL.Path+" is not in the agent API")
		return
	}
	a.mux.ServeHTTP(w, r)
}

func isRoute(h http.Handler, method string) bool {
	rt, ok := h.(*route)
	return ok && rt.method == method
}

// asSent returns r with its path escaped as ServeMux must see it to match
// the path as it was sent. The mux cleans a path before it matches it
// ("/v1/containers/.." becomes "/v1") and redirects to the clean one,
// where the agent API refuses such a name as a bad request: so the dots of
// every "." and ".." segment and the second slash of every "//" are
// escaped, which leaves the path the same once unescaped.
func asSent(r *http.Request) *http.Request {
	sent := r.URL.EscapedPath()
	segs := strings.Split(strings.ReplaceAll(sent, "//", "/%2F"), "/")
	for i, seg := range segs {
		if seg == "." || seg == ".." {
			segs[i] = strings.ReplaceAll(seg, ".", "%2E")
		}
	}
	esc := strings.Join(segs, "/")
	if esc == sent {
		return r
	}
	r2 := new(http.Request)
	*r2 = *r
	u := *r.URL
	u.RawPath = esc
	r2.URL = &u
	return r2
}

// call is the operation that decodes a request of type Req, calls fn and
// answers with its result as JSON with status, or with its error.
func call[Req, Resp any](status int, fn func(context.Context, Req) (Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if !decode(w, r, &req) {
			return
		}
		out, err := fn(r.Context(), req)
		if err != nil {
			failErr(w, err)
			return
		}
		writeJSON(w, status, out)
	}
}

// do is call for operations that answer nothing (204).
func do[Req any](fn func(context.Context, Req) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if !decode(w, r, &req) {
			return
		}
		if err := fn(r.Context(), req); err != nil {
			failErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

// withName is the operation on the container its path names, refused as
// a bad request if the name is not a container's.
func withName(fn func(w http.ResponseWriter, r *http.Request, name string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		if err := container.ValidName(name); err != nil {
			fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, err.Error())
			return
		}
		fn(w, r, name)
	}
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
	case errors.Is(err, container.ErrExecNotFound):
		fail(w, http.StatusNotFound, agentv1.CodeExecNotFound, err.Error())
	case errors.Is(err, container.ErrExecNotExecutable):
		fail(w, http.StatusBadRequest, agentv1.CodeExecNotExecutable, err.Error())
	case errors.Is(err, container.ErrUserNSExec):
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
