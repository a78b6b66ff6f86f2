// Package tier keeps checkpoint images beyond the cluster that took them:
// in a bucket of an S3-compatible object store or in a directory of a
// shared file system (the durable tier). A Repo lays a job's images out in
// the store's own formats (packs, index files, manifests: docs/format.md)
// over a Bucket, so that a flush uploads only the chunks the bucket lacks,
// a fetch verifies every byte it brings back, and retention deletes
// exactly what no kept checkpoint references.
package tier

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// A Bucket is a flat space of immutable objects named by keys: what a
// Repo needs of an object store. Put writes an object whole (a reader
// sees all of it or nothing); Get of a missing object gives an error
// matching ErrNotExist, as does GetRange, whose range past the object's
// end gives one matching ErrShort; Delete of a missing object is
// no error. List returns the objects whose keys start with prefix, in
// key order. Keys are made by this package: slash-separated, without
// empty, "." or ".." components.
type Bucket interface {
	Put(ctx context.Context, key string, data []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
	GetRange(ctx context.Context, key string, off, n int64) ([]byte, error)
	List(ctx context.Context, prefix string) ([]Object, error)
	Delete(ctx context.Context, key string) error
	// String names the bucket for messages: its URL, never a secret.
	String() string
}

// Object is one listed object.
type Object struct {
	Key  string
	Size int64
}

var (
	// ErrNotExist is matched by the error of reading a missing object.
	ErrNotExist = errors.New("no such object")
	// ErrCorrupt is matched by the error of reading an object whose
	// content does not verify: it is never used, and never deleted.
	ErrCorrupt = errors.New("damaged object in the durable tier")
	// ErrShort is matched by GetRange of a range that ends past the
	// object: of a pack the repo's index says holds it, a truncated one.
	ErrShort = errors.New("range past the end of the object")
	// ErrUnreachable is matched when the tier cannot be reached at all.
	ErrUnreachable = errors.New("durable tier unreachable")
	// ErrDenied is matched when the tier refuses the credentials.
	ErrDenied = errors.New("durable tier denied access")
)

// checkKey refuses a key this package would not make: it keeps a
// file-system bucket inside its directory whatever a caller passes.
func checkKey(key string) error {
	if key == "" || strings.HasPrefix(key, "/") {
		return fmt.Errorf("invalid object key %q", key)
	}
	for _, c := range strings.Split(key, "/") {
		if c == "" || strings.HasPrefix(c, ".") || strings.ContainsRune(c, 0) {
			return fmt.Errorf("invalid object key %q", key)
		}
	}
	return nil
}
