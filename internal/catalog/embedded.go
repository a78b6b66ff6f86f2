package catalog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sync"
	"syscall"
	"time"

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
)

// ErrLocked is returned by StartEmbedded when another server, in this
// process or another, runs on the same data directory.
var ErrLocked = errors.New("data directory in use by another etcd server")

// EmbeddedOptions configures StartEmbedded.
type EmbeddedOptions struct {
	// Dir is etcd's data directory, made private (mode 0700) and created
	// if missing. Starting again on the same Dir keeps the data. Besides
	// etcd's member/ directory it holds the files lock and etcd.log.
	Dir string

	// ClientAddr is the host:port where clients connect, over plain gRPC
	// without authentication. "" means 127.0.0.1 on a free port; see
	// Embedded.Endpoints.
	ClientAddr string

	// QuotaBytes caps the size of the backend database; writes fail with
	// "mvcc: database space exceeded" beyond it. 0 means 256 MiB.
	QuotaBytes int64

	// Logger receives etcd's log, every record at level Debug. nil means
	// etcd logs at Info and above to the file etcd.log in Dir (moved aside
	// to etcd.log.1 when it passes 16 MiB). etcd never logs to stderr.
	Logger *slog.Logger
}

// Embedded is a single-member etcd server running in this process.
type Embedded struct {
	etcd      *embed.Etcd
	lock      *os.File
	log       *logFile // nil when logging to an slog.Logger
	endpoints []string
	closeOnce sync.Once
	closeErr  error
}

// StartEmbedded starts a single-member etcd in opts.Dir and returns once it
// serves clients. If ctx ends first, the server is stopped again and ctx's
// error returned.
func StartEmbedded(ctx context.Context, opts EmbeddedOptions) (*Embedded, error) {
	if opts.Dir == "" {
		return nil, errors.New("start embedded etcd: no data directory")
	}
	// etcd wants its data private; it only warns if it is not.
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	if err := os.Chmod(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	lock, err := lockDir(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	// A free port chosen here may be taken before etcd binds it; try again
	// with another.
	for attempt := 0; ; attempt++ {
		e, err := startEmbedded(ctx, opts)
		if err != nil && opts.ClientAddr == "" && attempt < 3 && errors.Is(err, syscall.EADDRINUSE) {
			continue
		}
		if err != nil {
			lock.Close()
			return nil, err
		}
		e.lock = lock
		return e, nil
	}
}

func startEmbedded(ctx context.Context, opts EmbeddedOptions) (_ *Embedded, err error) {
	clientAddr := opts.ClientAddr
	if clientAddr == "" {
		clientAddr, err = freeLoopbackAddr()
		if err != nil {
			return nil, fmt.Errorf("start embedded etcd: %w", err)
		}
	}
	clientURL, err := url.Parse("http://" + clientAddr)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: client address %q: %w", clientAddr, err)
	}
	// The peer listener is required but never used by a single member:
	// any free loopback port will do, and it is never advertised to anyone.
	peerURL, _ := url.Parse("http://127.0.0.1:0")

	em := &Embedded{endpoints: []string{clientURL.String()}}
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
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.TickMs = uint(embeddedTick / time.Millisecond)
	cfg.ElectionMs = uint(embeddedElection / time.Millisecond)
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
		return em, nil
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

// freeLoopbackAddr returns 127.0.0.1 with a port that was free a moment
// ago.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// Endpoints returns the client URLs to pass to Open.
func (e *Embedded) Endpoints() []string {
	return append([]string(nil), e.endpoints...)
}

// Close stops the server and waits until its goroutines have ended, its
// ports are closed and its data directory is unlocked. Clients' open
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
		e.lock.Close()
	})
	return e.closeErr
}
