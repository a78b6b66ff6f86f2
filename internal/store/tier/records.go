package tier

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/cairn-hpc/cairn/internal/store"
)

// recordsDir holds one record per checkpoint: what a restart from the
// tier needs besides the images (the job, where each rank's image is),
// as its writer encodes it. A record is written after every image it
// names, so a listed record is a whole checkpoint.
const recordsDir = "checkpoints/"

// maxRecord bounds a record read back: a record names a job and its
// ranks' manifests, never data.
const maxRecord = 64 << 20

// recordKey is the key of record seq with content hash sum:
// checkpoints/<seq>.<hash>, so that a record, like every object here, is
// verified by its name, and a listing tells every checkpoint's number.
func (r *Repo) recordKey(seq int, sum store.ID) string {
	return fmt.Sprintf("%s%s%d.%s", r.prefix, recordsDir, seq, sum)
}

// PutRecord writes the record of checkpoint seq, replacing any other of
// that number. Call it only once every image it names is flushed.
func (r *Repo) PutRecord(ctx context.Context, seq int, data []byte) error {
	if seq <= 0 {
		return fmt.Errorf("record of checkpoint %d: numbers start at 1", seq)
	}
	key := r.recordKey(seq, store.Hash(data))
	if err := r.b.Put(ctx, key, data); err != nil {
		return fmt.Errorf("put record %d in %s: %w", seq, r, err)
	}
	objs, err := r.b.List(ctx, fmt.Sprintf("%s%s%d.", r.prefix, recordsDir, seq))
	if err != nil {
		return fmt.Errorf("put record %d in %s: %w", seq, r, err)
	}
	for _, o := range objs {
		if o.Key != key {
			if err := r.b.Delete(ctx, o.Key); err != nil {
				return fmt.Errorf("put record %d in %s: %w", seq, r, err)
			}
		}
	}
	return nil
}

// Records returns the numbers of the checkpoints the repo has a record
// of, in increasing order. A key under checkpoints/ of another shape is
// damage (ErrCorrupt), not a checkpoint.
func (r *Repo) Records(ctx context.Context) ([]int, error) {
	keys, err := r.records(ctx)
	if err != nil {
		return nil, err
	}
	seqs := make([]int, 0, len(keys))
	for seq := range keys {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	return seqs, nil
}

func (r *Repo) records(ctx context.Context) (map[int][]Object, error) {
	objs, err := r.b.List(ctx, r.prefix+recordsDir)
	if err != nil {
		return nil, fmt.Errorf("list records of %s: %w", r, err)
	}
	out := map[int][]Object{}
	for _, o := range objs {
		name := strings.TrimPrefix(o.Key, r.prefix+recordsDir)
		seqS, sumS, ok := strings.Cut(name, ".")
		seq, err := strconv.Atoi(seqS)
		if ok && err == nil && seq > 0 && strconv.Itoa(seq) == seqS {
			if _, err = store.ParseID(sumS); err == nil {
				out[seq] = append(out[seq], o)
				continue
			}
		}
		return nil, fmt.Errorf("list records of %s: %w: %q is no record", r, ErrCorrupt, o.Key)
	}
	return out, nil
}

// Record reads and verifies the record of checkpoint seq: ErrNotExist if
// there is none, ErrCorrupt if its content does not hash to its name.
func (r *Repo) Record(ctx context.Context, seq int) ([]byte, error) {
	keys, err := r.records(ctx)
	if err != nil {
		return nil, err
	}
	ks := keys[seq]
	if len(ks) == 0 {
		return nil, fmt.Errorf("record of checkpoint %d in %s: %w", seq, r, ErrNotExist)
	}
	o := ks[len(ks)-1]
	if o.Size > maxRecord {
		return nil, fmt.Errorf("%w: record of checkpoint %d in %s holds %d bytes", ErrCorrupt, seq, r, o.Size)
	}
	key := o.Key
	b, err := r.b.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("record of checkpoint %d in %s: %w", seq, r, err)
	}
	want := strings.TrimPrefix(key, fmt.Sprintf("%s%s%d.", r.prefix, recordsDir, seq))
	if got := store.Hash(b).String(); got != want {
		return nil, fmt.Errorf("%w: record of checkpoint %d in %s hashes to %s", ErrCorrupt, seq, r, got)
	}
	return b, nil
}

// DeleteRecord deletes the record of checkpoint seq: the checkpoint is
// no longer listed. Its images go with the next Prune that does not keep
// them.
func (r *Repo) DeleteRecord(ctx context.Context, seq int) error {
	keys, err := r.records(ctx)
	if err != nil {
		return err
	}
	for _, o := range keys[seq] {
		if err := r.b.Delete(ctx, o.Key); err != nil {
			return fmt.Errorf("delete record %d in %s: %w", seq, r, err)
		}
	}
	return nil
}
