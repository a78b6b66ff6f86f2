package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/human"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/table"
)

func newCheckpointCmd() *cobra.Command {
	var leaveRunning, stop, asJSON bool
	cmd := &cobra.Command{
		Use:   "checkpoint NAME | JOB",
		Short: "Checkpoint a running container (processes and files), or a whole job",
		Long: `Checkpoint a running container: freeze it, capture the files it wrote (its
overlay upper dir) and dump its processes with CRIU (established TCP
connections included) into staging memory, resume it, then persist the image
under the data dir with a manifest of sizes and hashes.

With the name of a job of the cluster, take a global checkpoint of all of its
ranks instead: one round of the two-phase commit (docs/protocols.md).

By default the container, or the job, keeps running (--leave-running); --stop
ends it at the checkpoint. A job stopped so never runs past the checkpoint:
once the round commits, every rank is ended while still frozen, and the job
is stopped; cairn restart JOB resumes it from there, on any nodes. A round
that aborts stops nothing (the job runs on, and the command fails).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if stop && cmd.Flags().Changed("leave-running") && leaveRunning {
				return usageError{errors.New("--stop and --leave-running contradict each other")}
			}
			if c, ok := asJob(cmd.Context(), args[0]); ok {
				defer c.Close()
				if err := notWith(cmd, "a job (its agents' --dump-timeout applies)", "dump-timeout"); err != nil {
					return err
				}
				return jobCheckpoint(cmd, c, args[0], coordv1.CheckpointJob{Stop: stop || !leaveRunning}, asJSON)
			}
			m, err := manager()
			if err != nil {
				return err
			}
			prog, done := progressBar("persisting "+args[0], asJSON)
			damage := m.Repo().WatchQuarantine()
			ctx, it := interruptible(cmd)
			man, err := m.Checkpoint(ctx, args[0], container.CheckpointOptions{Stop: stop || !leaveRunning, Progress: it.progress(prog)})
			done()
			it.stop()
			switch {
			case it.asked() && err != nil:
				return abandoned(m, args[0], err)
			case it.asked():
				return fmt.Errorf("%w: interrupted too late: checkpoint %s was taken whole and is kept (%s checkpoint rm %s removes it)", context.Canceled, man.Name(), cairnCmd(), man.Name())
			}
			if err != nil {
				return errors.Join(notFound(cmd.Context(), args[0], err), damage())
			}
			if asJSON {
				return errors.Join(printJSON(cmd.OutOrStdout(), man), damage())
			}
			t := man.Timing
			fmt.Fprintf(cmd.OutOrStdout(), "checkpoint %s: %s (%s new); stalled %s (dump %s), total %s\n",
				man.Name(), human.Bytes(man.Size()), human.Bytes(man.NewBytes), human.Duration(t.Stall), human.Duration(t.Dump), human.Duration(t.Total))
			return damage()
		},
	}
	f := cmd.Flags()
	f.BoolVar(&leaveRunning, "leave-running", true, "resume the container after the dump (default)")
	f.BoolVar(&stop, "stop", false, "end the container, or every rank of the job, at the checkpoint")
	f.BoolVar(&asJSON, "json", false, "print the checkpoint's manifest as JSON")
	for _, pin := range []bool{true, false} {
		use, short := "pin NAME:SEQ | JOB:SEQ...", "Keep checkpoints whatever gc's (or a job's --keep) retention says"
		if !pin {
			use, short = "unpin NAME:SEQ | JOB:SEQ...", "Let gc's (or a job's --keep) retention apply to checkpoints again"
		}
		cmd.AddCommand(&cobra.Command{
			Use:   use,
			Short: short,
			Args:  cobra.MinimumNArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return forEachRef(args, func(name string, seq int) error {
					if c, ok := asJob(cmd.Context(), name); ok {
						defer c.Close()
						_, err := c.PinCkpt(cmd.Context(), name, seq, pin)
						return err
					}
					m, err := manager()
					if err != nil {
						return err
					}
					return m.Repo().SetPinned(name, seq, pin)
				})
			},
		})
	}
	var rmJSON bool
	rm := &cobra.Command{
		Use:   "rm NAME:SEQ | JOB:SEQ...",
		Short: "Delete checkpoints (of a job: from the catalog, then from every node)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// What --json prints: each checkpoint deleted, and of a job's
			// the rank images dropped.
			type deleted struct {
				Name   string `json:"name"`
				Seq    int    `json:"seq"`
				Images *int   `json:"images,omitempty"`
			}
			done := []deleted{}
			err := forEachRef(args, func(name string, seq int) error {
				if c, ok := asJob(cmd.Context(), name); ok {
					defer c.Close()
					out, err := c.RemoveCkpt(cmd.Context(), name, seq)
					if err != nil {
						return err
					}
					done = append(done, deleted{name, seq, &out.Images})
					if !rmJSON {
						fmt.Fprintf(cmd.OutOrStdout(), "%s:%d (%d rank images dropped)\n", name, seq, out.Images)
					}
					return nil
				}
				m, err := manager()
				if err != nil {
					return err
				}
				if err := m.Repo().Remove(name, seq); err != nil {
					return err
				}
				done = append(done, deleted{Name: name, Seq: seq})
				if !rmJSON {
					fmt.Fprintf(cmd.OutOrStdout(), "%s:%d\n", name, seq)
				}
				return nil
			})
			if rmJSON {
				err = errors.Join(err, printJSON(cmd.OutOrStdout(), done))
			}
			return err
		},
	}
	rm.Flags().BoolVar(&rmJSON, "json", false, "print the checkpoints deleted as JSON")
	cmd.AddCommand(rm)
	return cmd
}

func newCheckpointsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "checkpoints [NAME | JOB]",
		Short: "List checkpoints (of one container, or all), or a job's global checkpoints",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if c, ok := asJob(cmd.Context(), args[0]); ok {
					defer c.Close()
					return jobCheckpoints(cmd, c, args[0], asJSON)
				}
			}
			m, err := manager()
			if err != nil {
				return err
			}
			names := args
			if len(names) == 0 {
				if names, err = m.Repo().Containers(); err != nil {
					return err
				}
			}
			var all []*image.Record
			var errs []error
			for _, n := range names {
				ms, err := m.Checkpoints(n)
				all = append(all, ms...)
				if err != nil {
					errs = append(errs, err)
				}
			}
			if err := printList(cmd.OutOrStdout(), asJSON, all, table.Checkpoints); err != nil {
				return err
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newRestoreCmd() *cobra.Command {
	var from, as string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "restore NAME [--from SEQ] [--as NEWNAME]",
		Short: "Restore a container from a checkpoint",
		Long: `Restore container NAME from its newest checkpoint (or --from SEQ): the image
is verified against its manifest first, the container gets a fresh root holding
exactly the files of the checkpoint (anything written later is gone, anything
deleted later is back), a fresh network namespace with the same address, and
its processes continue where they were.

NAME must not be running; --as NEWNAME restores a copy beside it.`,
		Example: `  cairn restore sim
  cairn restore sim --from 2
  cairn restore sim --from 2 --as sim-copy`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := container.RestoreOptions{As: as}
			if from != "" {
				name, seq, err := container.ParseCheckpointRef(from, args[0])
				if err != nil {
					return usageError{err}
				}
				if name != args[0] {
					return usageError{fmt.Errorf("--from %s names another container than %s", from, args[0])}
				}
				opts.Seq = seq
			}
			m, err := manager()
			if err != nil {
				return err
			}
			var done func()
			opts.Progress, done = progressBar("reading "+args[0], asJSON)
			damage := m.Repo().WatchQuarantine()
			in, err := m.Restore(cmd.Context(), args[0], opts)
			done()
			if err != nil {
				return errors.Join(err, damage())
			}
			if asJSON {
				return errors.Join(printJSON(cmd.OutOrStdout(), in), damage())
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s restored from %s (pid %d, address %s)\n", in.Name, in.RestoredFrom, in.Pid, in.Addr)
			return damage()
		},
	}
	f := cmd.Flags()
	f.StringVar(&from, "from", "", "checkpoint to restore: SEQ or NAME:SEQ (default: newest)")
	f.StringVar(&as, "as", "", "restore as a new container with this name")
	f.BoolVar(&asJSON, "json", false, "print the restored container as JSON")
	return cmd
}

func newVerifyCmd() *cobra.Command {
	var all, asJSON, readData bool
	cmd := &cobra.Command{
		Use:   "verify [NAME[:SEQ]...] [--all] [--read-data]",
		Short: "Check that checkpoints are complete and intact in the store",
		Long: `Check checkpoints: their records, their manifests, and that every chunk they
use is in the store, in a pack that is there. With --read-data every chunk is
read and checked against its hash (BLAKE3), which finds damaged data; a damaged
chunk is reported with every checkpoint that uses it. --all also reports
records that cannot be read, entries of the catalog that are no record, and
the whole store (packs, index, manifests, quarantined packs).

Every problem is a line starting with BAD; verify goes on after each and
exits 4 at the end if there was any.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			var refs []image.Ref
			for _, a := range args {
				if name, seq, err := container.ParseCheckpointRef(a, ""); err == nil && name != "" {
					refs = append(refs, image.Ref{Container: name, Seq: seq})
					continue
				}
				if err := container.ValidName(a); err != nil {
					return usageError{err}
				}
				refs = append(refs, image.Ref{Container: a})
			}
			if len(args) == 0 && !all {
				return usageError{errors.New("name checkpoints to verify, or --all")}
			}
			w := cmd.OutOrStdout()
			opts := image.VerifyOptions{All: all, ReadData: readData}
			opts.Progress = func(label, unit string) (image.Progress, func()) {
				return progressBarOf(label, asJSON || !readData, unit)
			}
			if !asJSON {
				opts.Stray = func(s image.Stray) { table.Stray(w, s) }
				opts.Result = func(r image.VerifyResult) { table.Verified(w, r) }
			}
			rep, err := m.Repo().VerifyAll(cmd.Context(), refs, opts)
			if err != nil {
				return err
			}
			if asJSON {
				if err := printJSON(w, rep); err != nil {
					return err
				}
			} else if rep.Store != nil {
				table.Store(w, *rep.Store)
			}
			if rep.Bad > 0 {
				return fmt.Errorf("%w: %d problems found (see above)", image.ErrCorrupt, rep.Bad)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "verify every checkpoint, the catalog and the store")
	cmd.Flags().BoolVar(&readData, "read-data", false, "read and hash every chunk")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// forEachRef calls fn for every NAME:SEQ in refs, going on after errors,
// and returns them all.
func forEachRef(refs []string, fn func(name string, seq int) error) error {
	var errs []error
	for _, ref := range refs {
		name, seq, err := container.ParseCheckpointRef(ref, "")
		if err == nil && name == "" {
			err = fmt.Errorf("bad checkpoint %q: want NAME:SEQ", ref)
		}
		if err != nil {
			errs = append(errs, usageError{err})
			continue
		}
		if err := fn(name, seq); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// abandoned is the error of a container's checkpoint interrupted (Ctrl-C):
// it says what state the container is in now, read afresh, rather than
// what the interruption made a step of the checkpoint say (a killed
// CRIU's last log line).
func abandoned(m *container.Manager, name string, err error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	state := "in a state cairn could not read"
	if in, gerr := m.Get(ctx, name); gerr == nil {
		state = table.Status(in)
	}
	return fmt.Errorf("%w: interrupted: the checkpoint of %s was abandoned and nothing of it kept; %s is %s (the step it stopped in: %v)", context.Canceled, name, name, state, err)
}

// interruption holds off a Ctrl-C during a container's checkpoint until
// its dump is over: CRIU killed in the middle of a dump leaves its code
// (the parasite) in the container's processes. The first Ctrl-C is
// noted and said; the checkpoint is cancelled as soon as the dump has
// ended (the ingest's first progress), and the container resumed.
type interruption struct {
	done      chan struct{}
	requested atomic.Bool
	cancel    context.CancelFunc
}

// interruptible is a context for cmd's checkpoint that its Ctrl-C does
// not cancel by itself (see interruption).
func interruptible(cmd *cobra.Command) (context.Context, *interruption) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(cmd.Context()))
	it := &interruption{done: make(chan struct{}), cancel: cancel}
	go func() {
		select {
		case <-cmd.Context().Done():
			it.requested.Store(true)
			fmt.Fprintln(cmd.ErrOrStderr(), "cairn: interrupted: the dump finishes first (killing CRIU in the middle would leave its code in the container's processes); then the checkpoint is abandoned")
		case <-it.done:
		}
	}()
	return ctx, it
}

// progress reports to p, and cancels the checkpoint once its dump is
// over if a Ctrl-C came.
func (it *interruption) progress(p image.Progress) image.Progress {
	return func(done, total int64) {
		if it.requested.Load() {
			it.cancel()
		}
		if p != nil {
			p(done, total)
		}
	}
}

func (it *interruption) asked() bool { return it.requested.Load() }

func (it *interruption) stop() {
	close(it.done)
	it.cancel()
}
