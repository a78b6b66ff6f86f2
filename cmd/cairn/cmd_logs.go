package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/agent"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/human"
	"github.com/cairn-hpc/cairn/internal/proc"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/table"
)

func newLogsCmd() *cobra.Command {
	var o logsOptions
	cmd := &cobra.Command{
		Use:   "logs [-f] [-t] [--since WHEN] [--tail N] [--incarnation N | --incarnations] NAME | JOB/RANK | JOB",
		Short: "Print the output (stdout and stderr) of a container, a job's rank or every rank of a job",
		Long: `Print the output (stdout and stderr) of a container of this node, of one rank
of a job of the cluster (JOB/RANK), or of every rank of a job (JOB): each line
labelled with its rank as srun --label does ("0: ..."), rank after rank, or with
-f as the lines come.

A container restored from a checkpoint (here, as a copy, or as a rank on any
node) is a new incarnation of it. Its output starts with everything printed up
to the checkpoint, then goes on with what the restored processes print: it
reads as one uninterrupted run's. What the incarnation it replaced printed
after that checkpoint (often why it failed) is not repeated in it, but kept as
that incarnation's output on the node where it ran, as long as the container or
rank stays there: --incarnations lists them (1 is the first run; a restore is
one more than the incarnation its checkpoint was taken in), --incarnation N
prints one.

Each line's time is when its node's cairn read it from the container: -t
prints it in front of the line, --since leaves out the lines that came
before a time (10m: ten minutes ago; or 2026-11-29T10:00:00Z, 2026-11-29
10:00 local time). Lines of output from before cairn kept times have none
("-"), and --since leaves them out.`,
		Example: `  cairn logs sim
  cairn logs -f --tail 20 sim/3
  cairn logs -t --since 10m sim`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			ref := args[0]
			if strings.Contains(ref, "/") {
				return rankLogs(cmd, ref, o)
			}
			if err := checkName(ref); err != nil {
				return err
			}
			if c, ok := asJob(cmd.Context(), ref); ok {
				defer c.Close()
				if o.list || o.incarnation > 0 {
					return usageError{fmt.Errorf("incarnations are a rank's: name one (%s/RANK)", ref)}
				}
				return tailed(cmd.OutOrStdout(), o, func(w io.Writer) error { return allRankLogs(cmd, w, c, ref, o.query()) })
			}
			return notFound(cmd.Context(), ref, containerLogs(cmd, ref, o))
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&o.follow, "follow", "f", false, "keep printing new output until the container (every rank) stops")
	f.IntVar(&o.incarnation, "incarnation", 0, "print the output of incarnation `N` instead of the current one")
	f.IntVar(&o.tail, "tail", 0, "print only the last `N` lines (of a job, with every rank's: the last N of them all); with -f, of a container only, then what comes")
	f.BoolVarP(&o.timestamps, "timestamps", "t", false, "print each line's time (RFC 3339, UTC) in front of it")
	f.StringVar(&o.sinceArg, "since", "", "print only the lines that came from `WHEN` on: a duration ago (10m, 2h) or a time (RFC 3339, or YYYY-MM-DD[ HH:MM[:SS]] local)")
	f.BoolVar(&o.list, "incarnations", false, "list the incarnations (runs and restores) whose output is kept here")
	f.BoolVar(&o.asJSON, "json", false, "with --incarnations: print them as JSON")
	return cmd
}

type logsOptions struct {
	follow, list, asJSON bool
	incarnation          int
	tail                 int // the last lines only (0: all)
	timestamps           bool
	sinceArg             string
	since                time.Time // from sinceArg
}

// query is what the options ask of a container's log.
func (o logsOptions) query() agentv1.LogQuery {
	return agentv1.LogQuery{Incarnation: o.incarnation, Follow: o.follow, Timestamps: o.timestamps, Since: o.since}
}

func (o *logsOptions) check() error {
	if o.sinceArg != "" {
		t, err := parseSince(o.sinceArg, time.Now())
		if err != nil {
			return usageError{err}
		}
		o.since = t
	}
	switch {
	case o.incarnation < 0:
		return usageError{errors.New("--incarnation counts from 1")}
	case o.list && (o.follow || o.incarnation > 0):
		return usageError{errors.New("--incarnations lists them: no -f or --incarnation with it")}
	case o.follow && o.incarnation > 0:
		return usageError{errors.New("-f follows the current incarnation; an earlier one's output is complete")}
	case o.asJSON && !o.list:
		return usageError{errors.New("--json goes with --incarnations")}
	case o.tail < 0:
		return usageError{errors.New("--tail N: the last N lines, N from 1")}
	case o.list && (o.tail > 0 || o.timestamps || o.sinceArg != ""):
		return usageError{errors.New("--tail, -t and --since are for output, not --incarnations")}
	}
	return nil
}

// parseSince reads --since: a duration before now, or a time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--since %s: a duration ago is not negative", s)
		}
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	for _, layout := range []string{"2006-01-02 15:04:05", "2006-01-02T15:04:05", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.Local); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("--since %q: want a duration ago (10m, 2h) or a time (2026-11-29T10:00:00Z, 2026-11-29 10:00)", s)
}

// containerLogs prints the output of a container of this node.
func containerLogs(cmd *cobra.Command, name string, o logsOptions) error {
	m, err := manager()
	if err != nil {
		return err
	}
	if o.list {
		incs, err := m.Incarnations(name)
		if err != nil {
			return err
		}
		wire := make([]agentv1.Incarnation, len(incs))
		for i, inc := range incs {
			wire[i] = agent.IncarnationWire(inc)
		}
		return printIncarnations(cmd.OutOrStdout(), wire, o.asJSON)
	}
	return m.CopyLog(cmd.Context(), cmd.OutOrStdout(), name, container.LogOptions{Incarnation: o.incarnation, Follow: o.follow, Tail: o.tail,
		Timestamps: o.timestamps, Since: o.since})
}

// tailed runs copy, which writes output to w, and prints only the last
// tail lines of it (all with tail 0). A rank's output comes from its
// agent as it is: with -f, which would print everything that comes,
// --tail is refused.
func tailed(w io.Writer, o logsOptions, copy func(io.Writer) error) error {
	if o.tail == 0 {
		return copy(w)
	}
	if o.follow {
		return usageError{errors.New("--tail with -f is for a container of this node; for a job's ranks, give one of them")}
	}
	tw := &human.TailWriter{W: w, N: o.tail}
	if err := copy(tw); err != nil {
		return err
	}
	return tw.Flush()
}

// rankLogs prints a rank's output, fetched from its node's agent.
func rankLogs(cmd *cobra.Command, ref string, o logsOptions) error {
	return withRank(cmd, ref, func(ctx context.Context, ra *rpc.RankAgents, rank int) error {
		if o.list {
			incs, err := ra.Incarnations(ctx, rank)
			if err != nil {
				return err
			}
			return printIncarnations(cmd.OutOrStdout(), incs, o.asJSON)
		}
		return tailed(cmd.OutOrStdout(), o, func(w io.Writer) error { return ra.Log(ctx, w, rank, o.query()) })
	})
}

// allRankLogs prints every rank's output, each line labelled "RANK: ":
// rank after rank, or with follow every rank's lines as they come.
func allRankLogs(cmd *cobra.Command, w io.Writer, c *rpc.CoordClient, job string, q agentv1.LogQuery) error {
	ra, err := c.RankAgents(cmd.Context(), job)
	if err != nil {
		return err
	}
	return ra.Logs(cmd.Context(), w, q)
}

// removed is what `cairn rm --json` says of one name.
type removed struct {
	Name string           `json:"name"`
	Kind string           `json:"kind"`          // container or job
	Job  *coordv1.Removed `json:"job,omitempty"` // what a job's removal deleted
}

func newRmCmd() *cobra.Command {
	var force, asJSON bool
	cmd := &cobra.Command{
		Use:   "rm [-f] NAME...",
		Short: "Remove containers (their checkpoints are kept), or jobs of the cluster",
		Long: `Remove containers of this node; a running one only with -f, which kills it
first. A container's checkpoints are kept (cairn checkpoint rm, cairn gc).

For a job of the cluster, remove its ranks, its network, its checkpoints and
every copy of its rank images on every node. A job that still runs or has
checkpoints is refused without -f; with -f, cairn says what it deleted.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, name := range args {
				if err := checkName(name); err != nil {
					return err
				}
			}
			m, err := manager()
			if err != nil {
				return err
			}
			var errs []error
			done := []removed{}
			for _, name := range args {
				if c, ok := asJob(cmd.Context(), name); ok {
					out, err := c.RemoveJob(cmd.Context(), name, force)
					c.Close()
					if err != nil {
						errs = append(errs, err)
						continue
					}
					done = append(done, removed{Name: name, Kind: "job", Job: &out})
					if !asJSON {
						fmt.Fprintf(cmd.OutOrStdout(), "%s: removed the job, %d ranks, %d checkpoints and %d rank images on live nodes\n", name, out.Ranks, out.Ckpts, out.Images)
					}
					continue
				}
				if err := m.Remove(cmd.Context(), name, force); err != nil {
					errs = append(errs, notFound(cmd.Context(), name, err))
					continue
				}
				done = append(done, removed{Name: name, Kind: "container"})
				if !asJSON {
					fmt.Fprintln(cmd.OutOrStdout(), name)
				}
			}
			if asJSON {
				errs = append(errs, printJSON(cmd.OutOrStdout(), done))
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "kill running containers first")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print what was removed as JSON")
	return cmd
}

func newKillCmd() *cobra.Command {
	var sig string
	cmd := &cobra.Command{
		Use:   "kill [--signal SIG] NAME",
		Short: "Send a signal to a container (default SIGKILL), or kill every rank of a job",
		Long: `Send a signal to a container. For a job of the cluster, kill every rank's
processes; the job and its checkpoints stay (cairn restart JOB).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := proc.ParseSignal(sig)
			if err != nil {
				return usageError{err}
			}
			if err := checkName(args[0]); err != nil {
				return err
			}
			if c, ok := asJob(cmd.Context(), args[0]); ok {
				defer c.Close()
				_, err := c.KillJob(cmd.Context(), args[0], int(s))
				return err
			}
			m, err := manager()
			if err != nil {
				return err
			}
			return notFound(cmd.Context(), args[0], m.Kill(cmd.Context(), args[0], s))
		},
	}
	cmd.Flags().StringVarP(&sig, "signal", "s", "KILL", "signal name or number")
	return cmd
}

func newWaitCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "wait NAME",
		Short: "Wait until a container stops (or every rank of a job); exit with its exit code",
		Long: `Wait until a container stops, or every rank of a job has ended, and
exit with its exit code (a job's: the worst of its ranks'). cairn's own
failures exit 125 (no such container or job, ...), so that a script tells
them from the container's codes.`,
		Args: func(cmd *cobra.Command, args []string) error { return asOwnError(cobra.ExactArgs(1)(cmd, args)) },
		RunE: func(cmd *cobra.Command, args []string) error {
			if c, ok := asJob(cmd.Context(), args[0]); ok {
				defer c.Close()
				return asOwnError(jobWait(cmd, c, args[0], asJSON))
			}
			m, err := manager()
			if err != nil {
				return asOwnError(err)
			}
			in, err := m.Wait(cmd.Context(), args[0])
			if err != nil {
				return asOwnError(notFound(cmd.Context(), args[0], err))
			}
			if asJSON {
				if err := printJSON(cmd.OutOrStdout(), in); err != nil {
					return asOwnError(err)
				}
			} else {
				fmt.Fprintln(cmd.OutOrStdout(), table.Status(in))
			}
			if in.Exit != nil && in.Exit.Code != 0 {
				return exitCodeError{in.Exit.Code}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the container (or the job, its ranks' states) as JSON once it has stopped")
	return cmd
}

func newExecCmd() *cobra.Command {
	var interactive, tty bool
	cmd := &cobra.Command{
		Use:   "exec [-i] [-t] NAME | JOB/RANK -- CMD [ARGS...]",
		Short: "Run a command inside a running container, or a rank of a job",
		Long: `Run CMD inside a running container of this node, or inside rank RANK of job
JOB wherever the cluster runs it (JOB/RANK), its output on this terminal's
stdout and stderr, and exit with its exit code. With -i, this stdin is
CMD's (streamed to the rank's node); without, CMD gets no input.

cairn's own failures exit as podman's do: 127 when CMD is not in the
container (a path from its working directory, or a name on its PATH), 126
when it is there but no executable file, 125 for anything else (no such
container or job, not running, usage). With -t, CMD runs on a terminal of
its own, its stdout and stderr merged on it: with -i and this stdin a
terminal, as a shell on it (raw, its size followed, Ctrl-C to CMD). Note: a
process started this way holds pipes to outside the container, so a
checkpoint of the container or the rank's job is refused until it has
ended.`,
		Example: `  cairn exec sim -- ls /tmp
  cairn exec -it sim/3 -- bash
  cairn exec -i sim/0 -- sh -c 'cat > /tmp/input' < input`,
		Args: func(cmd *cobra.Command, args []string) error { return asOwnError(cobra.MinimumNArgs(2)(cmd, args)) },
		RunE: func(cmd *cobra.Command, args []string) error {
			code, err := runExec(cmd, args[0], args[1:], interactive, tty)
			if err != nil {
				return asOwnError(err)
			}
			if code != 0 {
				return exitCodeError{code}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&interactive, "interactive", "i", false, "give CMD this stdin")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "run CMD on a terminal (with -i: this one's input, raw)")
	return cmd
}

// runExec runs args in ref, a container here or rank JOB/RANK, and
// returns its exit code: with this stdin its input if interactive, on a
// terminal of its own with tty. For a rank, this terminal, if stdin is
// one, is made raw while it runs (everything typed goes to CMD, Ctrl-C
// included), and its size and changes of it are sent; for a container
// here, runc does the same.
func runExec(cmd *cobra.Command, ref string, args []string, interactive, tty bool) (int, error) {
	var stdin io.Reader // nil: none
	if interactive {
		stdin = os.Stdin
	}
	if strings.Contains(ref, "/") {
		if tty {
			return rankExecTTY(cmd, ref, args, interactive)
		}
		return rankExec(cmd, ref, args, stdin)
	}
	m, err := manager()
	if err != nil {
		return -1, err
	}
	if tty {
		return m.ExecTTY(cmd.Context(), ref, args, stdin, cmd.OutOrStdout(), nil)
	}
	return m.Exec(cmd.Context(), ref, args, stdin, cmd.OutOrStdout(), cmd.ErrOrStderr())
}

// rankExecTTY runs args in rank JOB/RANK (ref) on its node on a terminal
// the agent makes, as runExec says.
func rankExecTTY(cmd *cobra.Command, ref string, args []string, interactive bool) (int, error) {
	size := agentv1.WinSize{Rows: 24, Cols: 80}
	sizeOf := func() (agentv1.WinSize, bool) {
		for _, f := range []*os.File{os.Stdin, os.Stdout} {
			if cols, rows, err := term.GetSize(int(f.Fd())); err == nil && rows > 0 && cols > 0 {
				return agentv1.WinSize{Rows: uint16(rows), Cols: uint16(cols)}, true
			}
		}
		return size, false
	}
	size, _ = sizeOf()
	resizes := make(chan agentv1.WinSize, 1)
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	go func() {
		for range winch {
			if ws, ok := sizeOf(); ok {
				select {
				case resizes <- ws:
				default:
				}
			}
		}
	}()
	var in io.Reader
	if interactive {
		in = os.Stdin
		if fd := int(os.Stdin.Fd()); term.IsTerminal(fd) {
			old, err := term.MakeRaw(fd)
			if err != nil {
				return -1, fmt.Errorf("make this terminal raw: %w", err)
			}
			defer term.Restore(fd, old)
		}
	}
	code := -1
	err := withRank(cmd, ref, func(ctx context.Context, ra *rpc.RankAgents, rank int) error {
		ac := ra.Agent(rank)
		defer ac.Close()
		var err error
		code, err = ac.ExecTTY(ctx, ra.RankName(rank), args, in, cmd.OutOrStdout(), size, resizes)
		return err
	})
	return code, err
}

// rankExec runs args in rank JOB/RANK (ref) on its node.
func rankExec(cmd *cobra.Command, ref string, args []string, stdin io.Reader) (int, error) {
	code := -1
	err := withRank(cmd, ref, func(ctx context.Context, ra *rpc.RankAgents, rank int) error {
		ac := ra.Agent(rank)
		defer ac.Close()
		var err error
		code, err = ac.Exec(ctx, ra.RankName(rank), args, stdin, cmd.OutOrStdout(), cmd.ErrOrStderr())
		return err
	})
	return code, err
}

// withRank calls f with where the ranks of JOB/RANK's (ref) job are and
// the rank, once the coordinator says the job has that rank.
func withRank(cmd *cobra.Command, ref string, f func(ctx context.Context, ra *rpc.RankAgents, rank int) error) error {
	job, rank, err := parseRankRef(ref)
	if err != nil {
		return err
	}
	return withCoord(func(c *rpc.CoordClient) error {
		ctx := cmd.Context()
		ra, err := c.RankAgents(ctx, job)
		if err != nil {
			return err
		}
		if rank >= ra.Ranks() {
			return usageError{fmt.Errorf("job %s has ranks 0..%d", job, ra.Ranks()-1)}
		}
		return f(ctx, ra, rank)
	})
}

// parseRankRef reads JOB/RANK.
func parseRankRef(ref string) (string, int, error) {
	job, rs, _ := strings.Cut(ref, "/")
	rank, err := strconv.Atoi(rs)
	if err != nil || rank < 0 || fmt.Sprint(rank) != rs {
		return "", 0, usageError{fmt.Errorf("%q: want JOB/RANK", ref)}
	}
	if err := checkName(job); err != nil {
		return "", 0, err
	}
	return job, rank, nil
}

// printIncarnations prints a container's or a rank's incarnations.
func printIncarnations(w io.Writer, incs []agentv1.Incarnation, asJSON bool) error {
	if asJSON {
		return printJSON(w, incs)
	}
	return table.Incarnations(w, incs)
}
