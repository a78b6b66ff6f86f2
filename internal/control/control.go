package control

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/dashboard"
	"github.com/cairn-hpc/cairn/internal/durable"
	"github.com/cairn-hpc/cairn/internal/events"
	"github.com/cairn-hpc/cairn/internal/metrics"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/service"

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
	// CADir, if set, is the cluster CA's directory (cairn init's pki):
	// the coordinator renews agents' certificates with it when they ask.
	CADir string
	// Coord are the coordinator's options; Run sets EtcdDesc, Events,
	// Metrics (with etcd's, from the default registry) and MetricsToken.
	Coord coord.Options
	// Logger: nil logs nothing.
	Logger *slog.Logger

	// Name is this coordinator's among the cluster's (default: the
	// host's name).
	Name string
	// Peers, for an embedded etcd of several members, maps every
	// coordinator's name to its etcd peer URL (https://IP:PORT), this
	// one's included: the same on each. nil: a single member.
	Peers map[string]string
	// Advertise is the address clients reach this coordinator's API at,
	// told them by the others (default: Listen's).
	Advertise string
	// HealthListen, if set, is where GET /healthz answers, plain HTTP
	// and unauthenticated (package service).
	HealthListen string

	clusterID string // the credentials', set by Run
}

func (cfg Config) name() string {
	if cfg.Name != "" {
		return cfg.Name
	}
	h, _ := os.Hostname()
	return h
}

// Run runs the coordinator until ctx is done. It stands for leadership
// among the coordinators of the catalog: while another leads it stands by
// (clients it answers are sent to the leader), and once it leads it
// finishes any protocol a previous coordinator left, then does the
// coordinator's work until it stops leading or ctx ends.
func Run(ctx context.Context, cfg Config) error {
	service.Take()
	c, err := pki.LoadCredentials(cfg.Creds)
	if err != nil {
		return err
	}
	if c.Role != pki.Coordinator {
		return fmt.Errorf("credentials in %s are for a %s, not the coordinator", cfg.Creds, c.Role)
	}
	cfg.clusterID = c.ClusterID
	if cfg.CADir != "" {
		ca, err := pki.Load(cfg.CADir)
		if err != nil {
			return fmt.Errorf("--ca: %w", err)
		}
		if ca.ClusterID != c.ClusterID {
			return fmt.Errorf("--ca: %s holds the CA of cluster %s, not %s", cfg.CADir, ca.ClusterID, c.ClusterID)
		}
		cfg.Coord.CA = ca
	}
	if cfg.Peers != nil && len(cfg.Etcd.Endpoints) > 0 {
		return errors.New("peers are for an embedded etcd of several members; an external etcd has its own")
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
		e, err := startEmbedded(ctx, cfg)
		if err != nil {
			return err
		}
		defer e.Close()
		catCfg, desc = catalog.Config{Endpoints: e.Endpoints()}, "embedded"
		if cfg.Peers != nil {
			desc = fmt.Sprintf("embedded, member %s of %d", cfg.name(), len(cfg.Peers))
		}
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
	log.Info("coordinator serving", "name", cfg.name(), "addr", ln.Addr().String(), "cluster", c.ClusterID, "etcd", desc)
	ev, err := events.New(events.Options{File: filepath.Join(cfg.Dir, "events.jsonl"), Logger: log})
	if err != nil {
		ln.Close()
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
	opts.Metrics = metrics.NewCoord(metrics.CoordOptions{Also: prometheus.DefaultGatherer,
		Certs: func() (time.Time, time.Time) { return c.Cert().NotAfter, c.CA.NotAfter }})
	service.KeepCredentials(ctx, c, service.ReloadEvery, log)
	if opts.CA != nil {
		// As agents have theirs renewed by asking it.
		go service.KeepRenewed(ctx, c, service.ExpiryWarning, time.Hour, "the CA this coordinator holds",
			func(context.Context) error { return renewWith(opts.CA, c) }, log)
	}
	l := &leadership{cfg: cfg, catCfg: catCfg, cat: cat, creds: c, opts: opts, uiToken: uiToken, log: log,
		addr: ln.Addr().String()}
	conf := pki.ServerConfig(c)
	if len(token) > 0 {
		conf = pki.ServerConfigOptionalCert(c) // the coordinator refuses all but a scrape with the token
	}
	sctx, stopServe := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- rpc.ServeTLS(sctx, ln, l, conf, log) }()
	if cfg.HealthListen != "" {
		if _, err := service.ServeHealth(sctx, cfg.HealthListen, log); err != nil {
			stopServe()
			<-served
			return err
		}
	}
	service.Ready(fmt.Sprintf("coordinator %s serving on %s (etcd: %s)", cfg.name(), ln.Addr(), desc), log)
	defer service.Stopping(log)
	err = l.run(ctx)
	stopServe()
	if serr := <-served; err == nil {
		err = serr
	}
	return err
}

// startEmbedded starts the embedded etcd in cfg.Dir/etcd, a member of
// several with cfg.Peers. A coordinator restarted right after the old one
// died may find the old one still letting go of it: that is waited for,
// up to 10 s.
func startEmbedded(ctx context.Context, cfg Config) (*catalog.Embedded, error) {
	opts := catalog.EmbeddedOptions{Dir: filepath.Join(cfg.Dir, "etcd")}
	if cfg.Peers != nil {
		opts.Member = &catalog.Member{Name: cfg.name(), Peers: cfg.Peers, Token: "cairn-" + cfg.clusterID,
			PeerCN: rpc.CoordServerName, TLS: catalog.TLSFiles{
				CA:   filepath.Join(cfg.Creds, pki.CACertFile),
				Cert: filepath.Join(cfg.Creds, pki.CertFile),
				Key:  filepath.Join(cfg.Creds, pki.KeyFile)}}
	}
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		e, err := catalog.StartEmbedded(ctx, opts)
		if !errors.Is(err, catalog.ErrLocked) || time.Since(start) > 10*time.Second {
			return e, err
		}
	}
}

// renewWith renews creds with ca as an agent's are renewed: a fresh key,
// a certificate for what the one in use says, both installed.
func renewWith(ca *pki.CA, creds *pki.Credentials) error {
	csr, key, err := creds.RenewalRequest()
	if err != nil {
		return err
	}
	cert, err := ca.SignRenewal(creds.Cert(), csr, pki.IssueOptions{})
	if err != nil {
		return err
	}
	return creds.Install(cert, key)
}

// Restore makes dir the state dir of a coordinator that starts from a
// backup (coord.Coordinator.Backup, `cairn catalog backup`): an embedded
// etcd in dir/etcd holding the backup's catalog, and the backup's event
// history in dir/events.jsonl. dir must hold neither: a restore never
// writes over a coordinator's state. Whatever fails leaves dir as it was.
// A coordinator started with --dir dir then takes over the cluster: the
// nodes join it again, the jobs' records, checkpoints and copies are the
// backup's.
func Restore(ctx context.Context, backup io.Reader, dir string) (coordv1.BackupInfo, error) {
	etcdDir, evFile := filepath.Join(dir, "etcd"), filepath.Join(dir, "events.jsonl")
	for _, p := range []string{etcdDir, evFile} {
		if _, err := os.Lstat(p); err == nil {
			return coordv1.BackupInfo{}, fmt.Errorf("restore: %s exists: restore into a directory without a coordinator's state", p)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return coordv1.BackupInfo{}, err
	}
	info, evs, err := restoreCatalog(ctx, backup, etcdDir)
	if err != nil {
		os.RemoveAll(etcdDir)
		return info, err
	}
	if err := durable.WriteFile(evFile, evs, 0o600); err != nil {
		os.RemoveAll(etcdDir)
		return info, err
	}
	return info, nil
}

// restoreCatalog starts an embedded etcd in etcdDir and restores backup
// into it.
func restoreCatalog(ctx context.Context, backup io.Reader, etcdDir string) (coordv1.BackupInfo, []byte, error) {
	e, err := catalog.StartEmbedded(ctx, catalog.EmbeddedOptions{Dir: etcdDir})
	if err != nil {
		return coordv1.BackupInfo{}, nil, err
	}
	defer e.Close()
	cat, err := catalog.Open(ctx, catalog.Config{Endpoints: e.Endpoints()})
	if err != nil {
		return coordv1.BackupInfo{}, nil, err
	}
	defer cat.Close()
	return coord.RestoreCatalog(ctx, cat, backup)
}
