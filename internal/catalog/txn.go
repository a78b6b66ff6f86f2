package catalog

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Cond is a condition of a Txn: the state a key must still be in.
type Cond struct {
	key string
	rev int64
}

// IfRevision holds while key's mod revision is still rev, the revision
// returned by Get or List when key was read: nothing has written key since.
// A rev of 0 means key is absent.
func IfRevision(key string, rev int64) Cond { return Cond{key: key, rev: rev} }

// IfAbsent holds while key does not exist.
func IfAbsent(key string) Cond { return Cond{key: key} }

// Op is a write of a Txn.
type Op struct {
	key    string
	val    any
	delete bool
}

// PutOp writes v as JSON at key.
func PutOp(key string, v any) Op { return Op{key: key, val: v} }

// DeleteOp removes key; it is not an error if key is absent.
func DeleteOp(key string) Op { return Op{key: key, delete: true} }

// Txn applies ops atomically if every condition in conds holds, and
// returns the revision of the writes. If any condition fails, nothing is
// written and the error is ErrConflict. This is how a decision is made
// once: for example, a checkpoint record read as "preparing" at revision r
// is set to "committed", together with whatever else the decision
// writes, under IfRevision(key, r); a concurrent abort that wrote the
// record first makes the commit fail with ErrConflict, and the other way
// round.
func (c *Catalog) Txn(ctx context.Context, conds []Cond, ops ...Op) (rev int64, err error) {
	cmps := make([]clientv3.Cmp, 0, len(conds))
	for _, cd := range conds {
		if err := checkKey(cd.key); err != nil {
			return 0, err
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(Root+cd.key), "=", cd.rev))
	}
	then := make([]clientv3.Op, 0, len(ops))
	var puts [][2]string
	for _, op := range ops {
		if err := checkKey(op.key); err != nil {
			return 0, err
		}
		if op.delete {
			then = append(then, clientv3.OpDelete(Root+op.key))
			continue
		}
		val, err := encode(op.key, op.val)
		if err != nil {
			return 0, err
		}
		then = append(then, clientv3.OpPut(Root+op.key, val))
		puts = append(puts, [2]string{Root + op.key, val})
	}
	// The conditions nest inside the fence's transaction, so that a
	// failed condition (a conflict) is told from a lost fence (deposed).
	resp, err := c.guarded(ctx, "txn on "+txnKeys(conds, ops), clientv3.OpTxn(cmps, then, nil))
	if err != nil {
		return 0, err
	}
	if !resp.Responses[0].GetResponseTxn().Succeeded {
		return 0, fmt.Errorf("txn on %s: %w", txnKeys(conds, ops), ErrConflict)
	}
	for _, p := range puts {
		c.wrote(p[0], p[1])
	}
	return resp.Header.Revision, nil
}

// txnKeys names a transaction in errors by its first key.
func txnKeys(conds []Cond, ops []Op) string {
	n := len(conds) + len(ops)
	var first string
	switch {
	case len(conds) > 0:
		first = conds[0].key
	case len(ops) > 0:
		first = ops[0].key
	default:
		return "no keys"
	}
	if n > 1 {
		return fmt.Sprintf("%s and %d more keys", first, n-1)
	}
	return first
}
