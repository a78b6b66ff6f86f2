package catalog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Tuning of the embedded member. A single member elects itself within one
// election timeout, so short ticks make start-up quick; they also lower
// etcd's minimum lease TTL (1.5 election timeouts) well below the
// seconds-long TTLs that membership uses.
const (
	embeddedTick        = 50 * time.Millisecond
	embeddedElection    = 250 * time.Millisecond
	embeddedSnapCount   = 10000
	embeddedCompaction  = "10m" // periodic: keep ten minutes of history for watchers to resume
	defaultQuotaBytes   = 256 << 20
	embeddedLogMaxBytes = 16 << 20
	embeddedMemberName  = "cairn"

	// A member of several talks to its peers over the network: a
	// heartbeat every 100 ms, as etcd's default, which suits round trips of
	// a data centre; an election after 500 ms without one (etcd's default
	// is 1 s), so that etcd has a new raft leader well within a
	// coordinator's election session (at least 2 s) and the sessions of
	// the coordinators that live on do not run out with the raft leader's.
	memberTick     = 100 * time.Millisecond
	memberElection = 500 * time.Millisecond

	// socketName is the unix socket in the data directory where clients
	// connect; maxSocketPath is the longest path a unix socket may have
	// (sun_path holds 108 bytes with the terminating NUL).
	socketName    = "etcd.sock"
	maxSocketPath = 107
)

// ErrLocked is returned by StartEmbedded when another server, in this
// process or another, runs on the same data directory.
var ErrLocked = errors.New("data directory in use by another etcd server")

// EmbeddedOptions configures StartEmbedded.
type EmbeddedOptions struct {
	// Dir is etcd's data directory, made private (mode 0700) and created
	// if missing; it must belong to this process's user. Starting again on
	// the same Dir keeps the data. Besides etcd's member/ directory it
	// holds the files lock and etcd.log, and the socket etcd.sock where
	// clients connect (see Embedded.Endpoints).
	Dir string

	// QuotaBytes caps the size of the backend database; writes fail with
	// "mvcc: database space exceeded" beyond it. 0 means 256 MiB.
	QuotaBytes int64

	// Logger receives etcd's log, every record at level Debug. nil means
	// etcd logs at Info and above to the file etcd.log in Dir (moved aside
	// to etcd.log.1 when it passes 16 MiB). etcd never logs to stderr.
	Logger *slog.Logger

	// Member, if set, makes the server one member of an etcd cluster of
	// several (an odd number): it talks to the others over mutual TLS on
	// its peer URL. Without it the server is a cluster of its own.
	Member *Member
}

// Member is what a member of a cluster of several needs: its name, every
// member's peer URL, and the credentials peers prove themselves with.
type Member struct {
	// Name is this member's name, a key of Peers.
	Name string
	// Peers maps every member's name to its peer URL, https://IP:PORT,
	// the same on every member; this member listens on its own.
	Peers map[string]string
	// Token tells this cluster from others started with the same peers
	// (etcd's initial-cluster-token).
	Token string
	// TLS are the files of this member's certificate, key and CA. A peer
	// must present a certificate of the same CA, with PeerCN as its
	// common name and the address it connects from among its IP SANs.
	TLS    TLSFiles
	PeerCN string
}

// initialCluster is etcd's --initial-cluster of m: name=url,...
func (m *Member) initialCluster() (string, []url.URL, error) {
	names := slices.Sorted(maps.Keys(m.Peers))
	var parts []string
	var own []url.URL
	for _, n := range names {
		u, err := url.Parse(m.Peers[n])
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return "", nil, fmt.Errorf("peer URL of member %s is %q: want https://IP:PORT", n, m.Peers[n])
		}
		parts = append(parts, n+"="+u.String())
		if n == m.Name {
			own = []url.URL{*u}
		}
	}
	if own == nil {
		return "", nil, fmt.Errorf("member %s is not among the peers %s", m.Name, strings.Join(names, ", "))
	}
	if len(names)%2 == 0 {
		return "", nil, fmt.Errorf("%d members: want an odd number, so that a majority survives the loss of a minority", len(names))
	}
	return strings.Join(parts, ","), own, nil
}

// Embedded is an etcd server running in this process: a cluster of its
// own, or a member of one (EmbeddedOptions.Member).
type Embedded struct {
	etcd      *embed.Etcd
	lock      *os.File
	log       *logFile // nil when logging to an slog.Logger
	endpoints []string
	sockDir   string // a private directory for the socket alone, removed by Close; "" when the socket is in Dir
	closeOnce sync.Once
	closeErr  error
}

// StartEmbedded starts a single-member etcd in opts.Dir and returns once it
// serves clients. If ctx ends first, the server is stopped again and ctx's
// error returned.
//
// The server opens no TCP port: clients connect through the unix socket
// etcd.sock in Dir, so only this user (and root) can reach it. A Dir whose
// socket path would be too long for a unix socket (107 bytes) gets its
// socket in a private directory of its own under os.TempDir instead.
func StartEmbedded(ctx context.Context, opts EmbeddedOptions) (*Embedded, error) {
	if opts.Dir == "" {
		return nil, errors.New("start embedded etcd: no data directory")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	opts.Dir = dir
	// etcd wants its data private; it only warns if it is not. The
	// socket's safety depends on it.
	if err := privateDir(opts.Dir); err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	lock, err := lockDir(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	e, err := startEmbedded(ctx, opts)
	if err != nil {
		lock.Close()
		return nil, err
	}
	e.lock = lock
	return e, nil
}

// privateDir makes dir if it is missing and checks that it is a directory
// of this process's user, then makes it mode 0700.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s belongs to user %d, not to this process's user %d", dir, st.Uid, os.Geteuid())
	}
	return os.Chmod(dir, 0o700)
}

func startEmbedded(ctx context.Context, opts EmbeddedOptions) (_ *Embedded, err error) {
	em := &Embedded{}
	sock := filepath.Join(opts.Dir, socketName)
	if len(sock) > maxSocketPath {
		// MkdirTemp makes it mode 0700.
		if em.sockDir, err = os.MkdirTemp("", "cairn-etcd-"); err != nil {
			return nil, fmt.Errorf("start embedded etcd: socket directory: %w", err)
		}
		defer func() {
			if err != nil {
				os.RemoveAll(em.sockDir)
			}
		}()
		sock = filepath.Join(em.sockDir, socketName)
		if len(sock) > maxSocketPath {
			return nil, fmt.Errorf("start embedded etcd: socket path %s is longer than %d bytes", sock, maxSocketPath)
		}
	}
	clientURL := url.URL{Scheme: "unix", Path: sock}
	// A single member has no peers to listen for: it has no peer listener.
	// A peer URL must still be advertised; this one is never dialled.
	peerURL := url.URL{Scheme: "http", Host: "127.0.0.1:0"}

	em.endpoints = []string{"unix://" + sock}
	var lg *zap.Logger
	if opts.Logger != nil {
		lg = newSlogZap(opts.Logger)
	} else {
		em.log, err = openLogFile(logPath(opts.Dir), embeddedLogMaxBytes)
		if err != nil {
			return nil, fmt.Errorf("start embedded etcd: open log: %w", err)
		}
		defer func() {
			if err != nil {
				em.log.Close()
			}
		}()
		lg = newFileZap(em.log)
	}

	cfg := embed.NewConfig()
	cfg.Name = embeddedMemberName
	cfg.Dir = opts.Dir
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = nil
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.TickMs = uint(embeddedTick / time.Millisecond)
	cfg.ElectionMs = uint(embeddedElection / time.Millisecond)
	if m := opts.Member; m != nil {
		ic, own, err := m.initialCluster()
		if err != nil {
			return nil, fmt.Errorf("start embedded etcd: %w", err)
		}
		if m.TLS.CA == "" || m.TLS.Cert == "" || m.TLS.Key == "" || m.PeerCN == "" {
			return nil, errors.New("start embedded etcd: a member of several needs peer TLS files and the peers' common name")
		}
		cfg.Name, cfg.InitialCluster, cfg.InitialClusterToken = m.Name, ic, m.Token
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = own, own
		cfg.PeerTLSInfo = transport.TLSInfo{CertFile: m.TLS.Cert, KeyFile: m.TLS.Key, TrustedCAFile: m.TLS.CA,
			ClientCertAuth: true, AllowedCNs: []string{m.PeerCN}}
		cfg.TickMs = uint(memberTick / time.Millisecond)
		cfg.ElectionMs = uint(memberElection / time.Millisecond)
	}
	cfg.SnapshotCount = embeddedSnapCount
	cfg.MaxSnapFiles = 2
	cfg.MaxWalFiles = 2
	cfg.AutoCompactionMode = embed.CompactorModePeriodic
	cfg.AutoCompactionRetention = embeddedCompaction
	cfg.QuotaBackendBytes = opts.QuotaBytes
	if cfg.QuotaBackendBytes == 0 {
		cfg.QuotaBackendBytes = defaultQuotaBytes
	}
	cfg.EnableGRPCGateway = false

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", opts.Dir, err)
	}
	em.etcd = e
	select {
	case <-e.Server.ReadyNotify():
		// The directory keeps others out; the socket's own mode too.
		if err = os.Chmod(sock, 0o600); err == nil {
			return em, nil
		}
		err = fmt.Errorf("start embedded etcd in %s: %w", opts.Dir, err)
	case err = <-e.Err():
		err = fmt.Errorf("start embedded etcd in %s: %w", opts.Dir, err)
	case <-e.Server.StopNotify():
		err = fmt.Errorf("start embedded etcd in %s: server stopped", opts.Dir)
	case <-ctx.Done():
		err = fmt.Errorf("start embedded etcd in %s: %w", opts.Dir, ctx.Err())
	}
	e.Close()
	return nil, err
}

// Endpoints returns the client URLs to pass to Open: the unix socket
// ("unix:///DIR/etcd.sock"), the same for every start on the same Dir.
func (e *Embedded) Endpoints() []string {
	return append([]string(nil), e.endpoints...)
}

// Close stops the server and waits until its goroutines have ended, its
// socket is removed and its data directory is unlocked. Clients' open
// streams (watches, lease keepalives) delay it up to etcd's request
// timeout (about 5 s), so close the Catalogs on it first. Close is
// idempotent.
func (e *Embedded) Close() error {
	e.closeOnce.Do(func() {
		e.etcd.Close()
		for err := range e.etcd.Err() {
			// Errors from servers that stopped because their listener
			// was closed are the shutdown itself.
			if err != nil && !errors.Is(err, net.ErrClosed) && e.closeErr == nil {
				e.closeErr = fmt.Errorf("close embedded etcd: %w", err)
			}
		}
		if e.log != nil {
			if err := e.log.Close(); err != nil && e.closeErr == nil {
				e.closeErr = fmt.Errorf("close embedded etcd log: %w", err)
			}
		}
		if e.sockDir != "" {
			if err := os.RemoveAll(e.sockDir); err != nil && e.closeErr == nil {
				e.closeErr = fmt.Errorf("close embedded etcd: %w", err)
			}
		}
		e.lock.Close()
	})
	return e.closeErr
}
