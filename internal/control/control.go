package control

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"time"

	"cairn/internal/catalog"
	"cairn/internal/coord"
	"cairn/internal/dashboard"
	"cairn/internal/events"
	"cairn/internal/metrics"
	"cairn/internal/pki"
	"cairn/internal/rpc"

	"github.com/prometheus/client_golang/prometheus"
)

// Config is everything a coordinator process runs with.
type Config struct {
	// Creds is the directory of the coordinator's credentials (role
	// coordinator).
	Creds string
	// Dir is the coordinator's state dir: the embedded etcd in Dir/etcd,
	// the events in Dir/events.jsonl.
	Dir string
	// Listen is the address the coordinator API is served on.
	Listen string
	// UITokenFile, if set, holds the read-only token of the dashboard's
	// own port, served on UIListen, a loopback address (docs/security.md,
	// "The dashboard"). The API serves the dashboard to client
	// certificates either way.
	UITokenFile, UIListen string
	// Etcd is an external etcd cluster; without endpoints, an embedded
	// one runs in Dir/etcd, reached through a unix socket only.
	Etcd catalog.Config
	// Hooks run for the events of their types, HTTP ones signed with
	// HookSecret (none: unsigned) and verified against HookRoots besides
	// the system's roots.
	Hooks      []events.Hook
	HookSecret []byte
	HookRoots  *x509.CertPool
	// MetricsTokenFile holds a bearer token that lets a scraper without a
	// client certificate read /metrics ("": none).
	MetricsTokenFile string
	// Coord are the coordinator's options; Run sets EtcdDesc, Events,
	// Metrics (with etcd's, from the default registry) and MetricsToken.
	Coord coord.Options
	// Logger: nil logs nothing.
	Logger *slog.Logger
}

// Run runs the coordinator until ctx is done: on start it finishes any
// protocol a previous coordinator left.
func Run(ctx context.Context, cfg Config) error {
	c, err := pki.LoadCredentials(cfg.Creds)
	if err != nil {
		return err
	}
	if c.Role != pki.Coordinator {
		return fmt.Errorf("credentials in %s are for a %s, not the coordinator", cfg.Creds, c.Role)
	}
	token, err := metrics.LoadToken(cfg.MetricsTokenFile)
	if err != nil {
		return err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, ep := range cfg.Etcd.Endpoints {
		if strings.HasPrefix(ep, "http://") {
			log.Warn("etcd without TLS: every user of this machine can reach it unless it requires authentication", "etcd", ep)
		}
	}
	for _, h := range cfg.Hooks {
		if h.URL != "" && len(cfg.HookSecret) == 0 {
			log.Warn("HTTP hook without a signature: give --hook-secret-file or $CAIRN_HOOK_SECRET", "hook", h.String())
		}
	}
	var uiToken []byte
	if cfg.UITokenFile != "" {
		if uiToken, err = dashboard.ReadToken(cfg.UITokenFile); err != nil {
			return err
		}
		if err := dashboard.CheckListen(cfg.UIListen); err != nil {
			return err
		}
	}
	catCfg, desc := cfg.Etcd, strings.Join(cfg.Etcd.Endpoints, ",")
	if len(catCfg.Endpoints) == 0 {
		e, err := startEmbedded(ctx, filepath.Join(cfg.Dir, "etcd"))
		if err != nil {
			return err
		}
		defer e.Close()
		catCfg, desc = catalog.Config{Endpoints: e.Endpoints()}, "embedded"
	}
	cat, err := catalog.Open(ctx, catCfg)
	if err != nil {
		return err
	}
	defer cat.Close()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	log.Info("coordinator serving", "addr", ln.Addr().String(), "cluster", c.ClusterID, "etcd", desc)
	var uiLn net.Listener
	if uiToken != nil {
		if uiLn, err = net.Listen("tcp", cfg.UIListen); err != nil {
			ln.Close()
			return err
		}
		defer uiLn.Close()
	}
	ev, err := events.New(events.Options{File: filepath.Join(cfg.Dir, "events.jsonl"), Logger: log})
	if err != nil {
		return err
	}
	defer ev.Close()
	hctx, stopHooks := context.WithCancel(ctx)
	hooksDone := make(chan struct{})
	go func() {
		events.RunHooks(hctx, ev, cfg.Hooks, events.HookOptions{Secret: cfg.HookSecret, RootCAs: cfg.HookRoots})
		close(hooksDone)
	}()
	defer func() { stopHooks(); <-hooksDone }()
	opts := cfg.Coord
	opts.EtcdDesc, opts.Events, opts.MetricsToken = desc, ev, token
	opts.Metrics = metrics.NewCoord(metrics.CoordOptions{Also: prometheus.DefaultGatherer})
	co := coord.New(cat, c, log, opts)
	if uiLn != nil {
		ui := dashboard.New(dashboard.Config{Source: co, Events: ev, Cluster: c.ClusterID, WriteTimeout: opts.WriteTimeout, Logger: log})
		uctx, stopUI := context.WithCancel(ctx)
		hs, err := dashboard.Server(uctx, uiLn, ui.Token(uiToken), log)
		if err != nil {
			stopUI()
			return err
		}
		uiDone := make(chan error, 1)
		go func() { uiDone <- rpc.Run(uctx, hs, uiLn) }()
		defer func() {
			stopUI()
			if err := <-uiDone; err != nil {
				log.Error("dashboard", "err", err)
			}
		}()
		log.Info("dashboard serving", "url", "http://"+uiLn.Addr().String()+dashboard.Prefix)
	}
	return co.Run(ctx, ln)
}

// startEmbedded starts the embedded etcd in dir. A coordinator restarted
// right after the old one died may find the old one still letting go of
// it: that is waited for, up to 10 s.
func startEmbedded(ctx context.Context, dir string) (*catalog.Embedded, error) {
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		e, err := catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: dir})
		if !errors.Is(err, catalog.ErrLocked) || time.Since(start) > 10*time.Second {
			return e, err
		}
	}
}
