package catalog

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Root is the etcd key prefix under which every catalog key lives.
const Root = "/cairn/"

var (
	// ErrNotFound is returned when a key is absent.
	ErrNotFound = errors.New("not found")

	// ErrExists is returned by Create when the key is already present.
	ErrExists = errors.New("already exists")

	// ErrConflict is returned by Txn when one of its conditions no longer
	// holds: a key it depends on was written since it was read.
	ErrConflict = errors.New("conflict")
)

// Config configures Open.
type Config struct {
	// Endpoints are the etcd client URLs, such as Embedded.Endpoints.
	Endpoints []string

	// TLS secures the connection; nil means plain gRPC.
	TLS *tls.Config

	// DialTimeout bounds Open's first round trip to etcd. 0 means 5 s.
	DialTimeout time.Duration

	// Logger receives the etcd client's log, every record at Debug. nil
	// discards it.
	Logger *slog.Logger
}

// Catalog is a client of the catalog in etcd. Its methods may be called
// concurrently.
type Catalog struct {
	cli       *clientv3.Client
	writes    atomic.Int64  // puts that took effect
	written   atomic.Int64  // bytes of their keys and values
	done      chan struct{} // closed by Close; ends Watch goroutines
	fence     atomic.Pointer[fence]
	closeOnce sync.Once
	closeErr  error
}

// Open connects to etcd and checks that it answers before it returns.
func Open(ctx context.Context, cfg Config) (*Catalog, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("open catalog: no endpoints")
	}
	timeout := cfg.DialTimeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	lg := zap.NewNop()
	if cfg.Logger != nil {
		lg = newSlogZap(cfg.Logger)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		TLS:                  cfg.TLS,
		DialTimeout:          timeout,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Logger:               lg,
	})
	if err != nil {
		return nil, fmt.Errorf("open catalog at %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := cli.Get(pctx, Root, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, fmt.Errorf("open catalog at %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	return &Catalog{cli: cli, done: make(chan struct{})}, nil
}

// Close closes the connection. Watch channels are closed; Memberships are
// not revoked (their leases expire). Close is idempotent.
func (c *Catalog) Close() error {
	c.closeOnce.Do(func() {
		close(c.done)
		if err := c.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			c.closeErr = fmt.Errorf("close catalog: %w", err)
		}
	})
	return c.closeErr
}

// Client returns the underlying etcd client, for what this package does
// not offer. Its keys are absolute: prefix them with Root.
func (c *Catalog) Client() *clientv3.Client { return c.cli }

// checkKey rejects keys that are empty or absolute.
func checkKey(key string) error {
	if key == "" || strings.HasPrefix(key, "/") {
		return fmt.Errorf("catalog key %q: must be non-empty and relative", key)
	}
	return nil
}

// checkPrefix rejects absolute prefixes; "" is the whole catalog.
func checkPrefix(prefix string) error {
	if strings.HasPrefix(prefix, "/") {
		return fmt.Errorf("catalog prefix %q: must be relative", prefix)
	}
	return nil
}

// decode resets *v to its zero value and decodes raw into it, so no field
// survives from an earlier value.
func decode(key string, raw []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("decode %s: need a non-nil pointer, have %T", key, v)
	}
	rv.Elem().SetZero()
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("decode %s: %w", key, err)
	}
	return nil
}

func encode(key string, v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode %s: %w", key, err)
	}
	return string(b), nil
}

// Get decodes the JSON value at key into v, a non-nil pointer that is first
// reset to its zero value, and returns the value's mod revision: the
// revision of the write that last changed it, to pass to IfRevision.
// It returns ErrNotFound if key is absent.
func (c *Catalog) Get(ctx context.Context, key string, v any) (rev int64, err error) {
	raw, rev, err := c.GetRaw(ctx, key)
	if err != nil {
		return 0, err
	}
	return rev, decode(key, raw, v)
}

// GetRaw returns the bytes at key and their mod revision, or ErrNotFound.
func (c *Catalog) GetRaw(ctx context.Context, key string) ([]byte, int64, error) {
	if err := checkKey(key); err != nil {
		return nil, 0, err
	}
	resp, err := c.cli.Get(ctx, Root+key)
	if err != nil {
		return nil, 0, fmt.Errorf("get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	kv := resp.Kvs[0]
	return kv.Value, kv.ModRevision, nil
}

// Create writes v as JSON at key if key is absent, and returns ErrExists
// if it is present.
func (c *Catalog) Create(ctx context.Context, key string, v any) error {
	_, err := c.Txn(ctx, []Cond{IfAbsent(key)}, PutOp(key, v))
	if errors.Is(err, ErrConflict) {
		return fmt.Errorf("create %s: %w", key, ErrExists)
	}
	return err
}

// Put writes v as JSON at key, whatever was there.
func (c *Catalog) Put(ctx context.Context, key string, v any) error {
	if err := checkKey(key); err != nil {
		return err
	}
	val, err := encode(key, v)
	if err != nil {
		return err
	}
	if _, err := c.guarded(ctx, "put "+key, clientv3.OpPut(Root+key, val)); err != nil {
		return err
	}
	c.wrote(Root+key, val)
	return nil
}

// Written is what a Catalog has written to etcd: the puts that took
// effect and the bytes of their keys and values (what etcd stores, before
// its own overhead).
type Written struct {
	Puts  int64
	Bytes int64
}

// Written returns what c has written since it was opened.
func (c *Catalog) Written() Written {
	return Written{Puts: c.writes.Load(), Bytes: c.written.Load()}
}

func (c *Catalog) wrote(key, val string) {
	c.writes.Add(1)
	c.written.Add(int64(len(key) + len(val)))
}

// Update reads key into v (reset to its zero value first), calls fn, and
// writes v back if key has not changed since it was read; if it has, it
// reads again and calls fn again, until the write succeeds or ctx ends. fn
// mutates v, or returns an error to stop: Update then writes nothing and
// returns fn's error as it is. Update returns ErrNotFound if key is absent.
func (c *Catalog) Update(ctx context.Context, key string, v any, fn func() error) error {
	for {
		rev, err := c.Get(ctx, key, v)
		if err != nil {
			return err
		}
		if err := fn(); err != nil {
			return err
		}
		_, err = c.Txn(ctx, []Cond{IfRevision(key, rev)}, PutOp(key, v))
		if !errors.Is(err, ErrConflict) {
			return err
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("update %s: %w", key, err)
		}
	}
}

// Delete removes key, and returns ErrNotFound if it was absent.
func (c *Catalog) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	resp, err := c.guarded(ctx, "delete "+key, clientv3.OpDelete(Root+key))
	if err != nil {
		return err
	}
	if resp.Responses[0].GetResponseDeleteRange().Deleted == 0 {
		return fmt.Errorf("delete %s: %w", key, ErrNotFound)
	}
	return nil
}

// DeletePrefix removes every key that starts with prefix, and returns how
// many there were. An empty prefix is refused, so that a bug cannot wipe
// the catalog.
func (c *Catalog) DeletePrefix(ctx context.Context, prefix string) (int64, error) {
	if prefix == "" {
		return 0, errors.New("delete prefix: empty prefix")
	}
	if err := checkPrefix(prefix); err != nil {
		return 0, err
	}
	resp, err := c.guarded(ctx, "delete prefix "+prefix, clientv3.OpDelete(Root+prefix, clientv3.WithPrefix()))
	if err != nil {
		return 0, err
	}
	return resp.Responses[0].GetResponseDeleteRange().Deleted, nil
}

// listPage is how many keys List asks etcd for at a time.
const listPage = 256

// List calls each, in key order and on the caller's goroutine, for every
// key that starts with prefix (relative to Root, as always) and its raw
// JSON value. raw belongs to each only until it returns. The listing is
// one consistent snapshot, taken at the returned revision: pass it to
// Watch to follow every change after it. An error from each stops List,
// which returns it as it is.
func (c *Catalog) List(ctx context.Context, prefix string, each func(key string, raw []byte) error) (rev int64, err error) {
	return c.list(ctx, prefix, func(kv *mvccpb.KeyValue) error { return each(strings.TrimPrefix(string(kv.Key), Root), kv.Value) })
}

// Backup is List of the whole catalog, less the keys that live only as
// long as a lease (members alive, the leader's): what a backup keeps,
// since a restored catalog gets new leases from the processes that run.
func (c *Catalog) Backup(ctx context.Context, each func(key string, raw []byte) error) (rev int64, err error) {
	return c.list(ctx, "", func(kv *mvccpb.KeyValue) error {
		if kv.Lease != 0 {
			return nil
		}
		return each(strings.TrimPrefix(string(kv.Key), Root), kv.Value)
	})
}

// list is List, with etcd's records.
func (c *Catalog) list(ctx context.Context, prefix string, each func(kv *mvccpb.KeyValue) error) (rev int64, err error) {
	if err := checkPrefix(prefix); err != nil {
		return 0, err
	}
	start, end := Root+prefix, clientv3.GetPrefixRangeEnd(Root+prefix)
	for {
		opts := []clientv3.OpOption{
			clientv3.WithRange(end),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend),
			clientv3.WithLimit(listPage),
		}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := c.cli.Get(ctx, start, opts...)
		if err != nil {
			return 0, fmt.Errorf("list %s: %w", prefix, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if err := each(kv); err != nil {
				return 0, err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}
