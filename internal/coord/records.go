package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/catalog"
	"github.com/cairn-hpc/cairn/internal/model"
)

// records reads and writes the coordinator's records in the catalog
// (the layout is in doc.go): every change is a compare-and-swap on its
// key.
type records struct{ c *Coordinator }

func nodeKey(name string) string         { return "nodes/" + name }
func jobKey(name string) string          { return "jobs/" + name }
func ckptPrefix(job string) string       { return "ckpts/" + job + "/" }
func ckptKey(job string, seq int) string { return fmt.Sprintf("ckpts/%s/%08d", job, seq) }

func (rc *records) job(ctx context.Context, name string) (*coordv1.Job, error) {
	c := rc.c
	var j coordv1.Job
	if _, err := c.cat.Get(ctx, jobKey(name), &j); err != nil {
		if errors.Is(err, catalog.ErrNotFound) {
			return nil, apiErr(agentv1.CodeNotFound, "no job %s", name)
		}
		return nil, err
	}
	return &j, nil
}

// updateJob changes a job's record with fn under compare-and-swap.
func (rc *records) updateJob(ctx context.Context, name string, fn func(*coordv1.Job) error) (*coordv1.Job, error) {
	c := rc.c
	var j coordv1.Job
	err := c.cat.Update(ctx, jobKey(name), &j, func() error { return fn(&j) })
	return &j, err
}

// ckpt reads checkpoint seq of job; a missing one is an error of code
// not found.
func (rc *records) ckpt(ctx context.Context, job string, seq int) (*coordv1.Ckpt, error) {
	var ck coordv1.Ckpt
	if _, err := rc.c.cat.Get(ctx, ckptKey(job, seq), &ck); err != nil {
		if errors.Is(err, catalog.ErrNotFound) {
			return nil, apiErr(agentv1.CodeNotFound, "no checkpoint %s:%d", job, seq)
		}
		return nil, err
	}
	return &ck, nil
}

// addCopy records that node holds rank's image of checkpoint seq of job.
// note, if set, changes the record in the same update (a replica's span
// and bytes).
func (rc *records) addCopy(ctx context.Context, job string, seq, rank int, node string, note func(*coordv1.Ckpt)) error {
	var ck coordv1.Ckpt
	return rc.c.cat.Update(ctx, ckptKey(job, seq), &ck, func() error {
		if note != nil {
			note(&ck)
		}
		for i := range ck.Ranks {
			if ck.Ranks[i].Rank == rank && !slices.Contains(copiesOf(ck.Ranks[i]), node) {
				ck.Ranks[i].Copies = append(copiesOf(ck.Ranks[i]), node)
			}
		}
		return nil
	})
}

func (rc *records) ckpts(ctx context.Context, job string) ([]coordv1.Ckpt, error) {
	c := rc.c
	return listBySeq(ctx, c, ckptPrefix(job), func(ck coordv1.Ckpt) int { return ck.Seq })
}

// listBySeq reads the records under prefix, ordered by their number.
func listBySeq[T any](ctx context.Context, c *Coordinator, prefix string, seq func(T) int) ([]T, error) {
	var out []T
	_, err := c.cat.List(ctx, prefix, func(_ string, raw []byte) error {
		var v T
		if err := json.Unmarshal(raw, &v); err != nil {
			return err
		}
		out = append(out, v)
		return nil
	})
	sort.Slice(out, func(a, b int) bool { return seq(out[a]) < seq(out[b]) })
	return out, err
}

// allNodes returns every node of the catalog by name, live or not.
func (rc *records) allNodes(ctx context.Context) (map[string]coordv1.Node, error) {
	c := rc.c
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]coordv1.Node, len(nodes))
	for _, n := range nodes {
		out[n.Name] = n
	}
	return out, nil
}

// liveNodes returns the live nodes by name.
func (rc *records) liveNodes(ctx context.Context) (map[string]coordv1.Node, error) {
	c := rc.c
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]coordv1.Node{}
	for _, n := range nodes {
		if n.Alive {
			out[n.Name] = n
		}
	}
	return out, nil
}

// load counts the ranks placed on each node by jobs that are not killed.
func (rc *records) load(ctx context.Context) (map[string]int, error) {
	c := rc.c
	jobs, err := c.Jobs(ctx)
	if err != nil {
		return nil, err
	}
	load := map[string]int{}
	for _, j := range jobs {
		if j.Ended() {
			continue
		}
		for _, n := range j.Placement {
			load[n]++
		}
	}
	return load, nil
}

// advance moves the catalog's counter at key one step: next changes the
// value read into v, and the result is written back atomically. A counter
// that does not exist yet is made with first's value; one another
// coordinator made meanwhile is advanced instead.
func (rc *records) advance(ctx context.Context, key string, v any, next, first func()) error {
	c := rc.c
	err := c.cat.Update(ctx, key, v, func() error { next(); return nil })
	if !errors.Is(err, catalog.ErrNotFound) {
		return err
	}
	first()
	if err = c.cat.Create(ctx, key, v); errors.Is(err, catalog.ErrExists) {
		return rc.advance(ctx, key, v, next, first)
	}
	return err
}

// failures is what the catalog holds of the cluster's node failures.
func (rc *records) failures(ctx context.Context) model.Failures {
	c := rc.c
	var f model.Failures
	_, _ = c.cat.Get(ctx, failuresKey, &f)
	return f
}
