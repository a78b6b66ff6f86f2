package image

import (
	"context"
	"errors"
	"fmt"

	"github.com/cairn-hpc/cairn/internal/names"
)

// Ref names checkpoints: one (Seq > 0) or every one of a container (Seq
// 0).
type Ref struct {
	Container string
	Seq       int
}

// VerifyOptions say what VerifyAll checks and whom it tells.
type VerifyOptions struct {
	// All adds every container's checkpoints, the catalog's stray entries
	// and the whole store to what is checked.
	All bool
	// ReadData reads every chunk and checks it against its id.
	ReadData bool
	// Progress, if not nil, gives the progress of one checkpoint's
	// verification or of the store's check (unit "" counts bytes); done
	// ends it.
	Progress func(label, unit string) (p Progress, done func())
	// Stray and Result, if not nil, are told of each stray entry and of
	// each checkpoint's result as soon as it is known.
	Stray  func(Stray)
	Result func(VerifyResult)
}

// VerifyResult is one checkpoint's verification, or a record that cannot
// be read.
type VerifyResult struct {
	Checkpoint string `json:"checkpoint"`
	OK         bool   `json:"ok"`
	Error      string `json:"error,omitempty"`
}

// VerifyReport is what VerifyAll found.
type VerifyReport struct {
	Checkpoints []VerifyResult `json:"checkpoints"`
	Catalog     []Stray        `json:"catalog,omitempty"` // stray entries of the catalog
	Store       *StoreReport   `json:"store,omitempty"`
	Bad         int            `json:"bad"` // problems found
}

// VerifyAll verifies the checkpoints of refs (with opts.All, of every
// container too, then the catalog and the store), going on after each
// problem: problems are in the report, counted in Bad. It returns an error
// only when it cannot go on: a container of refs without any checkpoint
// is ErrNotFound.
func (r Repo) VerifyAll(ctx context.Context, refs []Ref, opts VerifyOptions) (VerifyReport, error) {
	rep := VerifyReport{Checkpoints: []VerifyResult{}}
	report := func(res VerifyResult) {
		rep.Checkpoints = append(rep.Checkpoints, res)
		if !res.OK {
			rep.Bad++
		}
		if opts.Result != nil {
			opts.Result(res)
		}
	}
	progress := func(label, unit string) (Progress, func()) {
		if opts.Progress == nil {
			return nil, func() {}
		}
		return opts.Progress(label, unit)
	}
	if opts.All {
		strays, err := r.Strays()
		if err != nil {
			return rep, err
		}
		rep.Catalog = strays
		for _, s := range strays {
			rep.Bad++
			if opts.Stray != nil {
				opts.Stray(s)
			}
		}
		all, err := r.Containers()
		if err != nil {
			return rep, err
		}
		for _, n := range all {
			if names.Container(n) == nil { // others are strays
				refs = append(refs, Ref{Container: n})
			}
		}
	}
	var targets []Ref
	for _, ref := range refs {
		if ref.Seq > 0 {
			targets = append(targets, ref)
			continue
		}
		recs, errs := r.List(ref.Container)
		for _, err := range errs {
			// A record that cannot be read is reported, not skipped.
			res := VerifyResult{Checkpoint: ref.Container, Error: err.Error()}
			var ce *CorruptError
			if errors.As(err, &ce) && ce.Image != "" {
				res.Checkpoint = ce.Image
			}
			report(res)
		}
		if len(recs) == 0 && len(errs) == 0 && !opts.All {
			return rep, fmt.Errorf("%w: %s", ErrNotFound, ref.Container)
		}
		for _, rec := range recs {
			targets = append(targets, Ref{ref.Container, rec.Seq})
		}
	}
	for _, t := range targets {
		res := VerifyResult{Checkpoint: fmt.Sprintf("%s:%d", t.Container, t.Seq), OK: true}
		p, done := progress("verifying "+res.Checkpoint, "")
		_, err := r.Verify(ctx, t.Container, t.Seq, opts.ReadData, p)
		done()
		if err != nil {
			res.OK, res.Error = false, err.Error()
		}
		report(res)
	}
	if opts.All {
		p, done := progress("checking the store", "chunks")
		st, err := r.CheckStore(ctx, opts.ReadData, p)
		done()
		if err != nil && !errors.Is(err, ErrNotFound) {
			return rep, err
		}
		if err == nil {
			rep.Store = &st
			rep.Bad += len(st.Problems)
		}
	}
	return rep, nil
}
