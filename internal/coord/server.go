package coord

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"syscall"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/dashboard"
	"github.com/cairn-hpc/cairn/internal/metrics"
	"github.com/cairn-hpc/cairn/internal/names"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

// callerKey keys the caller's identity in a request's context.
type callerKey struct{}

// Who may call a route.
var (
	anyone     = []pki.Role{pki.Agent, pki.Client, pki.Coordinator}
	agentsOnly = []pki.Role{pki.Agent}
	clients    = []pki.Role{pki.Client, pki.Coordinator}
)

// handler returns the coordinator API (api/coord/v1) and its metrics:
// every request is authenticated by its client certificate (a scrape of
// /metrics may carry the read-only token instead), then routed by method
// and path; a route names the roles that may call it.
func (c *Coordinator) handler() http.Handler {
	mux := http.NewServeMux()
	route := func(pattern string, roles []pki.Role, h http.HandlerFunc) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			id := r.Context().Value(callerKey{}).(pki.Identity)
			for _, role := range roles {
				if id.Role == role {
					h(w, r)
					return
				}
			}
			if len(roles) == 1 && roles[0] == pki.Agent {
				fail(w, http.StatusForbidden, agentv1.CodeForbidden, fmt.Sprintf("only agents join; %s %s is not one", id.Role, id.Name))
				return
			}
			fail(w, http.StatusForbidden, agentv1.CodeForbidden, fmt.Sprintf("%s %s may not call %s", id.Role, id.Name, r.URL.Path))
		})
	}
	route("GET "+coordv1.PathHealth, anyone, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, coordv1.Health{Cluster: c.creds.ClusterID, Version: "v1", Etcd: c.opts.EtcdDesc})
	})
	route("POST "+coordv1.PathJoin, agentsOnly, c.serveJoin)
	route("POST "+coordv1.PathHeartbeat, agentsOnly, c.serveHeartbeat)
	route("POST "+coordv1.PathRenew, agentsOnly, c.serveRenew)
	route("GET "+coordv1.PathBackup, clients, func(w http.ResponseWriter, r *http.Request) {
		_, b, err := c.Backup(r.Context())
		if err != nil {
			failErr(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		_, _ = w.Write(b)
	})
	route("GET "+coordv1.PathEvents, clients, c.serveEvents)
	route("GET "+coordv1.PathNodes, clients, func(w http.ResponseWriter, r *http.Request) {
		nodes, err := c.Nodes(r.Context())
		reply(w, http.StatusOK, nodes, err)
	})
	route("POST "+coordv1.PathNode+"{node}"+coordv1.SuffixSpare, clients, func(w http.ResponseWriter, r *http.Request) {
		var req coordv1.Spare
		node, ok := nodeParam(w, r)
		if !ok || !decode(w, r, &req) {
			return
		}
		n, err := c.SetSpare(r.Context(), node, req.Spare)
		reply(w, http.StatusOK, n, err)
	})
	route("POST "+coordv1.PathNode+"{node}"+coordv1.SuffixDrain, clients, func(w http.ResponseWriter, r *http.Request) {
		var req coordv1.Drain
		node, ok := nodeParam(w, r)
		if !ok || !decode(w, r, &req) {
			return
		}
		// A drain belongs to the cluster: a CLI that goes away does not
		// cancel it.
		out, err := c.Drain(context.WithoutCancel(r.Context()), node, req)
		reply(w, http.StatusOK, out, err)
	})
	route("GET "+coordv1.PathJobs, clients, func(w http.ResponseWriter, r *http.Request) {
		jobs, err := c.Jobs(r.Context())
		reply(w, http.StatusOK, jobs, err)
	})
	route("POST "+coordv1.PathJobs, clients, func(w http.ResponseWriter, r *http.Request) {
		var req coordv1.RunJob
		if !decode(w, r, &req) {
			return
		}
		j, err := c.RunJob(r.Context(), req)
		reply(w, http.StatusCreated, j, err)
	})
	job := func(suffix string) string { return coordv1.PathJob + "{job}" + suffix }
	jobRoute := func(pattern string, h func(w http.ResponseWriter, r *http.Request, name string)) {
		route(pattern, clients, func(w http.ResponseWriter, r *http.Request) {
			name := r.PathValue("job")
			if err := validJobName(name); err != nil {
				fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, err.Error())
				return
			}
			h(w, r, name)
		})
	}
	jobRoute("GET "+job(""), func(w http.ResponseWriter, r *http.Request, name string) {
		st, err := c.Status(r.Context(), name)
		reply(w, http.StatusOK, st, err)
	})
	jobRoute("DELETE "+job(""), func(w http.ResponseWriter, r *http.Request, name string) {
		out, err := c.RemoveJob(r.Context(), name, r.URL.Query().Get("force") == "1")
		reply(w, http.StatusOK, out, err)
	})
	jobRoute("POST "+job(coordv1.SuffixKill), func(w http.ResponseWriter, r *http.Request, name string) {
		var req coordv1.Kill
		if r.ContentLength != 0 && !decode(w, r, &req) {
			return
		}
		if req.Signal < 0 || req.Signal > 64 {
			fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, fmt.Sprintf("signal %d: not a signal", req.Signal))
			return
		}
		j, err := c.KillJob(r.Context(), name, syscall.Signal(req.Signal))
		reply(w, http.StatusOK, j, err)
	})
	// Checkpoints, migrations and restarts belong to the cluster, not to
	// the request: a CLI that goes away does not cancel them.
	jobRoute("POST "+job(coordv1.SuffixCheckpoint), func(w http.ResponseWriter, r *http.Request, name string) {
		var req coordv1.CheckpointJob
		if r.ContentLength != 0 && !decode(w, r, &req) {
			return
		}
		ck, err := c.Checkpoint(context.WithoutCancel(r.Context()), name, req)
		reply(w, http.StatusOK, ck, err)
	})
	jobRoute("POST "+job(coordv1.SuffixFlush), func(w http.ResponseWriter, r *http.Request, name string) {
		var req coordv1.Flush
		if !decode(w, r, &req) {
			return
		}
		ck, err := c.Flush(context.WithoutCancel(r.Context()), name, req)
		reply(w, http.StatusOK, ck, err)
	})
	// A job's checkpoint: removed, pinned or unpinned.
	ckptRoute := func(pattern string, h func(w http.ResponseWriter, r *http.Request, name string, seq int)) {
		jobRoute(pattern, func(w http.ResponseWriter, r *http.Request, name string) {
			seq, err := strconv.Atoi(r.PathValue("seq"))
			if err != nil || seq < 1 {
				fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, fmt.Sprintf("checkpoint number %q: a number from 1", r.PathValue("seq")))
				return
			}
			h(w, r, name, seq)
		})
	}
	ckptRoute("DELETE "+job(coordv1.SuffixCheckpoints+"/{seq}"), func(w http.ResponseWriter, r *http.Request, name string, seq int) {
		out, err := c.RemoveCkpt(context.WithoutCancel(r.Context()), name, seq)
		reply(w, http.StatusOK, out, err)
	})
	ckptRoute("POST "+job(coordv1.SuffixCheckpoints+"/{seq}"+coordv1.SuffixPin), func(w http.ResponseWriter, r *http.Request, name string, seq int) {
		var req coordv1.Pin
		if !decode(w, r, &req) {
			return
		}
		ck, err := c.PinCkpt(r.Context(), name, seq, req)
		reply(w, http.StatusOK, ck, err)
	})
	jobRoute("POST "+job(coordv1.SuffixMigrate), func(w http.ResponseWriter, r *http.Request, name string) {
		var req coordv1.Migrate
		if !decode(w, r, &req) {
			return
		}
		m, err := c.Migrate(context.WithoutCancel(r.Context()), name, req)
		if err != nil && m != nil && m.State == coordv1.MigrationDone {
			err = nil // it moved; the errors are in m.Reason
		}
		reply(w, http.StatusOK, m, err)
	})
	jobRoute("GET "+job(coordv1.SuffixMigrations), func(w http.ResponseWriter, r *http.Request, name string) {
		ms, err := c.Migrations(r.Context(), name)
		reply(w, http.StatusOK, ms, err)
	})
	jobRoute("GET "+job(coordv1.SuffixReport), c.serveReport)
	jobRoute("GET "+job(coordv1.SuffixCheckpoints), func(w http.ResponseWriter, r *http.Request, name string) {
		cks, err := c.Checkpoints(r.Context(), name)
		reply(w, http.StatusOK, cks, err)
	})
	jobRoute("POST "+job(coordv1.SuffixRestart), func(w http.ResponseWriter, r *http.Request, name string) {
		var req coordv1.Restart
		if !decode(w, r, &req) {
			return
		}
		j, err := c.Restart(context.WithoutCancel(r.Context()), name, req)
		reply(w, http.StatusOK, j, err)
	})
	var scrape http.Handler
	if c.opts.Metrics != nil {
		scrape = metrics.Handler(c.opts.Metrics)
		route("GET "+metrics.Path, clients, scrape.ServeHTTP)
	}
	targets := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nodes, err := c.Nodes(r.Context())
		if err != nil {
			failErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, metrics.Targets(nodes))
	})
	route("GET "+metrics.TargetsPath, clients, targets)
	c.ranks.rankRoutes(route)
	ui := dashboard.New(dashboard.Config{Source: c, Events: c.opts.Events, Cluster: c.creds.ClusterID, WriteTimeout: c.opts.WriteTimeout, Logger: c.log})
	route("GET "+dashboard.Prefix, clients, ui.ServeHTTP) // read-only; docs/cluster.md, "Dashboard"
	// Anything else, including a known path with another method.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		id := r.Context().Value(callerKey{}).(pki.Identity)
		if id.Role == pki.Agent {
			fail(w, http.StatusForbidden, agentv1.CodeForbidden, fmt.Sprintf("%s %s may not call %s", id.Role, id.Name, r.URL.Path))
			return
		}
		fail(w, http.StatusNotFound, agentv1.CodeNotFound, r.Method+" "+r.URL.Path+" is not in the coordinator API")
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.opts.MetricsToken.Allows(r) { // the read-only token, with or without a certificate
			switch {
			case r.URL.Path == metrics.TargetsPath:
				targets.ServeHTTP(w, r)
				return
			case scrape != nil:
				scrape.ServeHTTP(w, r)
				return
			}
		}
		id, ok := rpc.Caller(w, r)
		if !ok {
			return
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, id)))
	})
}

// ServeHTTP serves the coordinator API.
func (c *Coordinator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.httpOnce.Do(func() { c.http = c.handler() })
	c.http.ServeHTTP(w, r)
}

func nodeParam(w http.ResponseWriter, r *http.Request) (string, bool) {
	node := r.PathValue("node")
	if err := names.Node(node); err != nil {
		failErr(w, err)
		return "", false
	}
	return node, true
}

// serveJoin handles an agent's join. An agent may only speak for the node
// its certificate names.
func (c *Coordinator) serveJoin(w http.ResponseWriter, r *http.Request) {
	id := r.Context().Value(callerKey{}).(pki.Identity)
	var j coordv1.Join
	if !decode(w, r, &j) {
		return
	}
	if j.Name != id.Name {
		fail(w, http.StatusForbidden, agentv1.CodeForbidden, fmt.Sprintf("agent %s may not join as node %s", id.Name, j.Name))
		return
	}
	out, err := c.Join(r.Context(), j)
	reply(w, http.StatusOK, out, err)
}

// serveRenew renews the calling agent's certificate with the CA this
// coordinator holds (Options.CA): the new certificate is for the name,
// role and addresses of the one the caller's connection presented.
func (c *Coordinator) serveRenew(w http.ResponseWriter, r *http.Request) {
	id := r.Context().Value(callerKey{}).(pki.Identity)
	if c.opts.CA == nil {
		fail(w, http.StatusNotImplemented, coordv1.CodeNoCA, "this coordinator holds no CA (coordinator --ca): renew with `cairn node cert --renew` where the CA is, then reload the agent")
		return
	}
	var req coordv1.RenewCert
	if !decode(w, r, &req) {
		return
	}
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		fail(w, http.StatusUnauthorized, agentv1.CodeUnauthorized, "no client certificate")
		return
	}
	cert, err := c.opts.CA.SignRenewal(r.TLS.PeerCertificates[0], req.CSR, pki.IssueOptions{})
	if err != nil {
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, err.Error())
		return
	}
	c.log.Info("certificate renewed", "node", id.Name, "role", id.Role, "valid_until", cert.NotAfter)
	writeJSON(w, http.StatusOK, coordv1.RenewCertReply{Cert: cert.Raw})
}

// serveHeartbeat handles an agent's heartbeat, for the node its
// certificate names only.
func (c *Coordinator) serveHeartbeat(w http.ResponseWriter, r *http.Request) {
	id := r.Context().Value(callerKey{}).(pki.Identity)
	var hb coordv1.Heartbeat
	if !decode(w, r, &hb) {
		return
	}
	if hb.Name != id.Name {
		fail(w, http.StatusForbidden, agentv1.CodeForbidden, fmt.Sprintf("agent %s may not speak for node %s", id.Name, hb.Name))
		return
	}
	rep, err := c.Heartbeat(r.Context(), hb)
	reply(w, http.StatusOK, rep, err)
}

// Join records a node that joins the cluster (again) and registers it
// alive. The caller has checked that the request speaks for the node it
// names.
func (c *Coordinator) Join(ctx context.Context, j coordv1.Join) (*coordv1.JoinReply, error) {
	if _, err := netip.ParseAddr(j.Underlay); err != nil {
		return nil, apiErr(agentv1.CodeBadRequest, "underlay: %v", err)
	}
	if _, _, err := net.SplitHostPort(j.Addr); err != nil {
		return nil, apiErr(agentv1.CodeBadRequest, "addr: %v", err)
	}
	if api := cmp.Or(j.API, "v1"); api != coordv1.APIVersion {
		c.log.Warn("refused a node of another API version", "node", j.Name, "api", api, "version", j.Version)
		return nil, apiErr(coordv1.CodeVersion, "agent %s (%s) speaks API %s, this coordinator API %s: coordinators and agents must speak the same API version (cairn version shows it); upgrade the older side (docs/operations.md, \"Upgrades\")",
			j.Name, cmp.Or(j.Version, "an unknown release"), api, coordv1.APIVersion)
	}
	n := coordv1.Node{Name: j.Name, Addr: j.Addr, Underlay: j.Underlay, Labels: j.Labels, Joined: time.Now().UTC(), Version: j.Version, CPU: j.CPU}
	var old coordv1.Node
	if _, err := c.cat.Get(ctx, nodeKey(j.Name), &old); err == nil {
		n.Spare, n.Drained = old.Spare, old.Drained // a node that comes back stays what it was
	}
	if err := c.cat.Put(ctx, nodeKey(j.Name), &n); err != nil {
		return nil, err
	}
	c.agents.forget(j.Name)
	if err := c.nodes.register(ctx, j.Name); err != nil {
		return nil, err
	}
	c.log.Info("node joined", "node", j.Name, "addr", j.Addr)
	c.publish(evv1.Event{Type: evv1.NodeJoined, Node: j.Name, Message: j.Addr})
	return &coordv1.JoinReply{Heartbeat: c.opts.NodeTTL / 4, TTL: c.opts.NodeTTL, Term: c.fence.termString()}, nil
}

// Heartbeat keeps a node alive and takes its health and quarantine
// reports. A node the catalog does not know gets a not-found error: it
// must join again.
func (c *Coordinator) Heartbeat(ctx context.Context, hb coordv1.Heartbeat) (*coordv1.HeartbeatReply, error) {
	if err := c.nodes.heartbeat(ctx, hb.Name); err != nil {
		return nil, err
	}
	c.nodes.noteHealth(ctx, hb.Name, hb.Health)
	c.nodes.noteQuarantine(ctx, hb.Name, hb.Quarantined)
	c.nodes.noteEnded(hb.Name, hb.Ended)
	rep := &coordv1.HeartbeatReply{Term: c.fence.termString()}
	rep.Release, rep.Drop = c.nodes.fenced(ctx, hb.Name, hb.Fenced)
	rep.Drop = append(rep.Drop, c.nodes.strays(ctx, hb.Name, hb.Live, hb.Fenced)...)
	return rep, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) { rpc.WriteJSON(w, status, v) }

func fail(w http.ResponseWriter, status int, code, msg string) { rpc.Fail(w, status, code, msg) }

func decode(w http.ResponseWriter, r *http.Request, v any) bool { return rpc.Decode(w, r, v) }

func reply(w http.ResponseWriter, status int, v any, err error) {
	if err != nil {
		failErr(w, err)
		return
	}
	if status == http.StatusNoContent {
		w.WriteHeader(status)
		return
	}
	writeJSON(w, status, v)
}

// failErr maps an error to the wire.
func failErr(w http.ResponseWriter, err error) {
	var we *agentv1.Error
	switch {
	case errors.As(err, &we):
		// Keep the code, but say where it came from.
		rpc.FailError(w, &agentv1.Error{Code: we.Code, Message: err.Error()})
	case errors.Is(err, names.ErrInvalid):
		fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, err.Error())
	case errors.Is(err, catalog.ErrNotFound):
		fail(w, http.StatusNotFound, agentv1.CodeNotFound, err.Error())
	case errors.Is(err, catalog.ErrExists):
		fail(w, http.StatusConflict, agentv1.CodeExists, err.Error())
	case errors.Is(err, catalog.ErrDeposed):
		// Its writes were refused: another coordinator leads now, and
		// finishes or undoes what this one began.
		fail(w, http.StatusServiceUnavailable, coordv1.CodeDeposed, err.Error())
	default:
		fail(w, http.StatusInternalServerError, agentv1.CodeInternal, err.Error())
	}
}
