package catalog

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrDeposed is returned by every write of a fenced Catalog (Fence) once
// its fence no longer holds: the leader it was fenced for has been
// replaced, and nothing it writes takes effect.
var ErrDeposed = errors.New("no longer the leader")

// fence is the condition every write of a fenced Catalog carries: the
// key of its leadership still exists with the creation revision it had
// when leadership was won.
type fence struct {
	key string // absolute
	rev int64
}

// Fence makes every later write of c (Put, Create, Update, Delete,
// DeletePrefix, Txn, Register) conditional on the key key (absolute, as
// an etcd election makes it) still existing with creation revision rev:
// the leadership won by that key. A write made after the leadership was
// lost fails with ErrDeposed and changes nothing, however late it
// arrives at etcd. Reads are not fenced. Fence may be called once, before
// the Catalog is shared.
func (c *Catalog) Fence(key string, rev int64) {
	c.fence.Store(&fence{key: key, rev: rev})
}

// guarded commits then (one or more writes) under c's fence, if it has
// one, and returns the responses of then. Without a fence it commits then
// as a plain transaction.
func (c *Catalog) guarded(ctx context.Context, what string, then ...clientv3.Op) (*clientv3.TxnResponse, error) {
	txn := c.cli.Txn(ctx)
	if f := c.fence.Load(); f != nil {
		txn = txn.If(clientv3.Compare(clientv3.CreateRevision(f.key), "=", f.rev))
	}
	resp, err := txn.Then(then...).Commit()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if !resp.Succeeded {
		return nil, fmt.Errorf("%s: %w", what, ErrDeposed)
	}
	return resp, nil
}
