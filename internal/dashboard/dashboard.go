package dashboard

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"path"
	"slices"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/events"
	"github.com/cairn-hpc/cairn/internal/names"
)

// Prefix is the path the dashboard is served under.
const Prefix = "/ui/"

// Source is what the dashboard reads of the cluster: the coordinator's
// read methods, which it calls with the request's context. An error
// that is an *agentv1.Error keeps its code (not_found, bad_request);
// any other is a failure of the coordinator.
type Source interface {
	Nodes(ctx context.Context) ([]coordv1.Node, error)
	Jobs(ctx context.Context) ([]coordv1.Job, error)
	Status(ctx context.Context, job string) (*coordv1.JobStatus, error)
	Checkpoints(ctx context.Context, job string) ([]coordv1.Ckpt, error)
	Migrations(ctx context.Context, job string) ([]coordv1.Migration, error)
}

// Config says what a Dashboard shows.
type Config struct {
	Source Source
	// Events is the cluster's event stream.
	Events *events.Exchange
	// Cluster is the cluster's id, shown in the page's title.
	Cluster string
	// WriteTimeout bounds each write of an event stream: a browser that
	// takes nothing for that long is cut off (default 30 s).
	WriteTimeout time.Duration
	// MaxStreams bounds the event streams open at once (default 16).
	MaxStreams int
	// Logger: nil logs nothing.
	Logger *slog.Logger
}

// Dashboard serves the page and its data. Its methods are safe for
// concurrent use.
type Dashboard struct {
	cfg     Config
	log     *slog.Logger
	mux     *http.ServeMux
	streams chan struct{} // a token per open event stream
}

// Defaults of Config.
const (
	DefaultWriteTimeout = 30 * time.Second
	DefaultMaxStreams   = 16
)

// readTimeout bounds the coordinator's answers to one request for data.
const readTimeout = 10 * time.Second

//go:embed ui
var uiFiles embed.FS

// New returns a dashboard over cfg.Source and cfg.Events.
func New(cfg Config) *Dashboard {
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	d := &Dashboard{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), streams: make(chan struct{}, cfg.MaxStreams)}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	static, _ := fs.Sub(uiFiles, "ui")
	page := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			http.ServeFileFS(w, r, static, name)
		}
	}
	d.mux.HandleFunc("GET "+Prefix+"{$}", page("index.html"))
	d.mux.HandleFunc("GET "+Prefix+"app.js", page("app.js"))
	d.mux.HandleFunc("GET "+Prefix+"style.css", page("style.css"))
	d.mux.HandleFunc("GET "+Prefix+"api/cluster", d.serveCluster)
	d.mux.HandleFunc("GET "+Prefix+"api/jobs/{job}", d.serveJob)
	d.mux.HandleFunc("GET "+Prefix+"api/events", d.serveEvents)
	return d
}

// ServeHTTP serves the dashboard under Prefix to a caller the server has
// authenticated. It answers GET and HEAD only.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	secureHeaders(w.Header())
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "the dashboard is read-only: GET and HEAD only")
		return
	}
	if r.URL.Path == path.Clean(Prefix) {
		http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
		return
	}
	if _, pattern := d.mux.Handler(r); pattern == "" {
		writeError(w, http.StatusNotFound, r.URL.Path+" is not part of the dashboard")
		return
	}
	d.mux.ServeHTTP(w, r)
}

// secureHeaders keeps the page to itself: its own scripts, styles and
// connections only, in no frame, telling nothing to other sites, and
// cached nowhere.
func secureHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "+
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

// NodeView is a node as the dashboard shows it: its record, and the jobs
// with a rank on it.
type NodeView struct {
	coordv1.Node
	Jobs []string `json:"jobs,omitempty"`
}

// JobView is what the dashboard shows of a job: neither its command
// line nor its environment, which may hold secrets.
type JobView struct {
	Name            string        `json:"name"`
	State           string        `json:"state"`
	Reason          string        `json:"reason,omitempty"`
	Mode            string        `json:"mode,omitempty"`
	MPI             string        `json:"mpi,omitempty"`
	Ranks           int           `json:"ranks"`
	Placement       []string      `json:"placement"`
	Created         time.Time     `json:"created"`
	Replicas        int           `json:"replicas"`
	OnFailure       string        `json:"on_failure,omitempty"`
	CheckpointEvery time.Duration `json:"checkpoint_every_ns,omitempty"`
	Restarts        int           `json:"restarts"`
	Migrations      int           `json:"migrations"`
	LastCkpt        int           `json:"last_ckpt"`
	RestoredFrom    int           `json:"restored_from,omitempty"`
}

func jobView(j coordv1.Job) JobView {
	return JobView{Name: j.Name, State: string(j.State), Reason: j.Reason, Mode: j.Mode, MPI: j.MPI, Ranks: j.Ranks,
		Placement: j.Placement, Created: j.Created, Replicas: j.Replicas, OnFailure: j.OnFailure,
		CheckpointEvery: j.CheckpointEvery, Restarts: j.Restarts, Migrations: j.Migrations, LastCkpt: j.LastCkpt,
		RestoredFrom: j.RestoredFrom}
}

// Cluster is the document of GET /ui/api/cluster.
type Cluster struct {
	Cluster string     `json:"cluster"`
	Nodes   []NodeView `json:"nodes"`
	Jobs    []JobView  `json:"jobs"`
}

func (d *Dashboard) serveCluster(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	nodes, err := d.cfg.Source.Nodes(ctx)
	if err != nil {
		d.fail(w, err)
		return
	}
	jobs, err := d.cfg.Source.Jobs(ctx)
	if err != nil {
		d.fail(w, err)
		return
	}
	out := Cluster{Cluster: d.cfg.Cluster, Nodes: []NodeView{}, Jobs: []JobView{}}
	for _, n := range nodes {
		nv := NodeView{Node: n}
		for _, j := range jobs {
			if slices.Contains(j.Placement, n.Name) && !j.Ended() {
				nv.Jobs = append(nv.Jobs, j.Name)
			}
		}
		out.Nodes = append(out.Nodes, nv)
	}
	for _, j := range jobs {
		out.Jobs = append(out.Jobs, jobView(j))
	}
	writeJSON(w, out)
}

// RankView is one rank's live state.
type RankView struct {
	Rank     int    `json:"rank"`
	Node     string `json:"node"`
	Addr     string `json:"addr"`
	Status   string `json:"status"`
	Pid      int    `json:"pid,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Error    string `json:"error,omitempty"`
}

// Job is the document of GET /ui/api/jobs/JOB.
type Job struct {
	Job      JobView      `json:"job"`
	Ranks    []RankView   `json:"ranks"`
	Timeline []Entry      `json:"timeline"`
	Events   []evv1.Event `json:"events"` // the newest of the job's events, oldest first
}

// recentEvents is how many of a job's events its document carries.
const recentEvents = 50

func (d *Dashboard) serveJob(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("job")
	if err := names.Job(name); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	st, err := d.cfg.Source.Status(ctx, name)
	if err != nil {
		d.fail(w, err)
		return
	}
	cks, err := d.cfg.Source.Checkpoints(ctx, name)
	if err != nil {
		d.fail(w, err)
		return
	}
	ms, err := d.cfg.Source.Migrations(ctx, name)
	if err != nil {
		d.fail(w, err)
		return
	}
	evs := d.cfg.Events.History(events.Filter{Job: name})
	lost := d.cfg.Events.History(events.Filter{Type: evv1.NodeLost, Since: st.Created})
	out := Job{Job: jobView(st.Job), Ranks: []RankView{}, Timeline: Timeline(st.Job, cks, ms, append(slices.Clone(evs), lost...))}
	for _, rs := range st.RankStates {
		out.Ranks = append(out.Ranks, RankView{Rank: rs.Rank, Node: rs.Node, Addr: rs.Addr, Status: string(rs.Status),
			Pid: rs.Pid, ExitCode: rs.ExitCode, Error: rs.Error})
	}
	out.Events = evs[max(0, len(evs)-recentEvents):]
	if out.Events == nil {
		out.Events = []evv1.Event{}
	}
	writeJSON(w, out)
}

// fail answers with err, by its API code if it has one.
func (d *Dashboard) fail(w http.ResponseWriter, err error) {
	var ae *agentv1.Error
	switch {
	case errors.As(err, &ae) && ae.Code == agentv1.CodeNotFound:
		writeError(w, http.StatusNotFound, err.Error())
	case errors.As(err, &ae) && ae.Code == agentv1.CodeBadRequest, errors.Is(err, names.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	default:
		d.log.Warn("dashboard: reading the cluster", "err", err)
		writeError(w, http.StatusBadGateway, err.Error())
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers with status and {"error": msg}.
func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}
