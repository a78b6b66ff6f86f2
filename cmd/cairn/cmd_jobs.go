package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/spf13/cobra"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/human"
	"github.com/cairn-hpc/cairn/internal/rpc"
	"github.com/cairn-hpc/cairn/internal/table"
	"github.com/cairn-hpc/cairn/internal/testbed"
)

// asJob returns a client of the cluster's coordinator when name is a job
// there and not a container on this node: commands such as wait, kill, rm
// and checkpoint then act on the job.
func asJob(ctx context.Context, name string) (*rpc.CoordClient, bool) {
	if strings.Contains(name, ":") || strings.Contains(name, "/") {
		return nil, false
	}
	if m, err := manager(); err == nil {
		if _, err := m.Get(ctx, name); err == nil {
			return nil, false
		}
	}
	c, err := coordClient()
	if err != nil {
		return nil, false
	}
	if _, err := c.Status(ctx, name); err != nil {
		c.Close()
		return nil, false
	}
	return c, true
}

func runJob(cmd *cobra.Command, req coordv1.RunJob, asJSON bool) error {
	return withCoord(func(c *rpc.CoordClient) error {
		j, err := c.RunJob(cmd.Context(), req)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), j)
		}
		out := cmd.OutOrStdout()
		fmt.Fprintf(out, "job %s: %d ranks on subnet %s\n", j.Name, j.Ranks, j.Subnet)
		table.Placement(out, j)
		return nil
	})
}

func newJobsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "jobs",
		Short: "List the cluster's jobs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return withCoord(func(c *rpc.CoordClient) error {
				jobs, err := c.Jobs(cmd.Context())
				if err != nil {
					return err
				}
				return printList(cmd.OutOrStdout(), asJSON, jobs, table.Jobs)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newNodesCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List the cluster's nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return withCoord(func(c *rpc.CoordClient) error {
				nodes, err := c.Nodes(cmd.Context())
				if err != nil {
					return err
				}
				return printList(cmd.OutOrStdout(), asJSON, nodes, table.Nodes)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func jobPs(cmd *cobra.Command, name string, asJSON, quiet bool, tmpl *template.Template) error {
	return withCoord(func(c *rpc.CoordClient) error {
		st, err := c.Status(cmd.Context(), name)
		if err != nil {
			return err
		}
		switch {
		case asJSON:
			return printJSON(cmd.OutOrStdout(), st)
		case quiet:
			for _, r := range st.RankStates {
				fmt.Fprintln(cmd.OutOrStdout(), agentv1.RankName(name, r.Rank))
			}
			return nil
		case tmpl != nil:
			return eachFormatted(cmd.OutOrStdout(), tmpl, st.RankStates)
		}
		return table.Ranks(cmd.OutOrStdout(), st)
	})
}

// jobWait waits until every rank of a job has exited.
func jobWait(cmd *cobra.Command, c *rpc.CoordClient, name string, asJSON bool) error {
	st, err := c.WaitJob(cmd.Context(), name, 500*time.Millisecond)
	if err != nil {
		return err
	}
	if asJSON {
		err = printJSON(cmd.OutOrStdout(), st)
	} else {
		for _, r := range st.RankStates {
			fmt.Fprintf(cmd.OutOrStdout(), "rank %d: %s (%d)\n", r.Rank, r.Status, exitOf(r))
		}
	}
	if err != nil {
		return err
	}
	for _, r := range st.RankStates {
		if code := exitOf(r); code != 0 {
			return exitCodeError{max(code, 1)} // the first rank's that failed; unknown (-1) is 1
		}
	}
	return nil
}

// exitOf is a rank's exit code, -1 if it has none.
func exitOf(r coordv1.Rank) int {
	if r.ExitCode == nil {
		return -1
	}
	return *r.ExitCode
}

// goesOn is the error of a cluster operation this command was
// interrupted in (Ctrl-C): the coordinator carries it out all the same,
// and how says where to see how it ended.
func goesOn(ctx context.Context, err error, what, see string) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	return fmt.Errorf("%w: interrupted, but the %s goes on at the coordinator, which does not stop when this command does; %s shows how it ends", context.Canceled, what, see)
}

func jobCheckpoint(cmd *cobra.Command, c *rpc.CoordClient, name string, req coordv1.CheckpointJob, asJSON bool) error {
	ck, err := c.Checkpoint(cmd.Context(), name, req)
	err = goesOn(cmd.Context(), err, "checkpoint round of job "+name, "`"+cairnCmd()+" checkpoints "+name+"`")
	var we *agentv1.Error
	aborted := errors.As(err, &we) && we.Code == coordv1.CodeAborted
	if err != nil && !aborted {
		return err
	}
	if asJSON {
		if perr := printJSON(cmd.OutOrStdout(), ck); perr != nil {
			return perr
		}
		return err
	}
	if aborted {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "checkpoint %s:%d %s: %d ranks, %s; ranks frozen %s (slowest dump %s, coordination %s)\n",
		ck.Job, ck.Seq, ck.State, len(ck.Ranks), human.Bytes(ck.Bytes), human.Duration(ck.Stall), human.Duration(ck.MaxDump), human.Duration(ck.Coord))
	if ck.Stop {
		fmt.Fprintf(cmd.OutOrStdout(), "job %s stopped at checkpoint %d: %s restart %s resumes it\n", ck.Job, ck.Seq, cairnCmd(), ck.Job)
	}
	return nil
}

func jobCheckpoints(cmd *cobra.Command, c *rpc.CoordClient, name string, asJSON bool) error {
	cks, err := c.Checkpoints(cmd.Context(), name)
	if err != nil {
		return err
	}
	return printList(cmd.OutOrStdout(), asJSON, cks, table.Ckpts)
}

func newRestartCmd() *cobra.Command {
	var from, tierURL string
	var nodes, placement []string
	var asJSON, lazy bool
	cmd := &cobra.Command{
		Use:   "restart JOB [--from N | --from URL] [--nodes n1,n2,... | --placement NODE0,NODE1,...]",
		Short: "Restart a whole job from a global checkpoint, on any nodes",
		Long: `Restart every rank of JOB from checkpoint N (default: the newest durable one
whose every rank image is on a live node). Whatever is left of the job is
removed first. Each target node fetches its ranks' images from the nodes that
hold them and restores them frozen with their network locked, all in
parallel; once every rank is restored, all resume together. Ranks keep their
addresses and the TCP connections between them. --nodes places the ranks on
those nodes (default: where their images are, else the least loaded);
--placement gives the node of every rank, in rank order. --lazy restores the
ranks whose node lacks their image lazily (docs/lazy.md): they run before
all of their memory has arrived, which comes from the image's holders while
they run; --lazy=false does not, whatever the job says (--lazy-restore).

--from URL restarts the job from the newest checkpoint in a durable tier
(s3://BUCKET/PREFIX, file:///DIR: where cairn flush, or the job's --tier,
put it), on a cluster that need not know the job: a new allocation with new
nodes and data dirs. The tier's record of the checkpoint gives the job and
each rank's image, which its node fetches (every chunk verified) before the
restart; --tier URL --from N picks checkpoint N there. The agents reach the
tier with the credentials of their own environment (docs/hpc.md).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withCoord(func(c *rpc.CoordClient) error {
				var err error
				start := time.Now()
				req := coordv1.Restart{Nodes: nodes, Placement: placement, Tier: tierURL}
				if from != "" {
					if isTierURL(from) {
						if tierURL != "" {
							return usageError{errors.New("--from URL and --tier: give the tier once")}
						}
						req.Tier = from
					} else if req.From, err = strconv.Atoi(from); err != nil || req.From < 1 {
						return usageError{fmt.Errorf("--from %q: a checkpoint number, or a tier URL (s3://BUCKET/PREFIX, file:///DIR)", from)}
					}
				}
				if cmd.Flags().Changed("lazy") {
					req.Lazy = &lazy
				}
				j, err := c.Restart(cmd.Context(), args[0], req)
				if err != nil {
					return goesOn(cmd.Context(), err, "restart of job "+args[0], "`"+cairnCmd()+" jobs`")
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), j)
				}
				out := cmd.OutOrStdout()
				fmt.Fprintf(out, "job %s restarted from checkpoint %d in %s\n", j.Name, j.RestoredFrom, human.Duration(time.Since(start)))
				table.Placement(out, j)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "checkpoint number (default: the newest restorable), or a durable tier's URL (s3://BUCKET/PREFIX, file:///DIR) to restart from its newest checkpoint")
	cmd.Flags().StringVar(&tierURL, "tier", "", "restart from checkpoint --from N of this durable tier")
	cmd.Flags().StringSliceVar(&nodes, "nodes", nil, "nodes to place the ranks on")
	cmd.Flags().StringSliceVar(&placement, "placement", nil, "node of each rank, in rank order")
	cmd.Flags().BoolVar(&lazy, "lazy", false, "restore ranks whose node lacks their image lazily (default: as the job says)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newNodeSpareCmd() *cobra.Command {
	var off, asJSON bool
	cmd := &cobra.Command{
		Use:   "spare NODE [--off]",
		Short: "Keep a node as a spare: no new jobs on it; restarts go there first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withCoord(func(c *rpc.CoordClient) error {
				n, err := c.SetSpare(cmd.Context(), args[0], !off)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), n)
				}
				what := "a spare"
				if !n.Spare {
					what = "no longer a spare"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "node %s is %s\n", n.Name, what)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&off, "off", false, "make the node an ordinary node again")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the node as JSON")
	return cmd
}

func newCoordinatorsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "coordinators",
		Short: "List the cluster's coordinators: which leads, with its term, and which stand by",
		Long: `List the coordinators that run, as they announce themselves in the catalog:
name, API address, host, pid, and for the leader its term and since when it
leads. Any coordinator answers, the leader or not. Of a local cluster
('cairn up'), a coordinator that does not run is listed as down.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return withCoord(func(c *rpc.CoordClient) error {
				list, err := c.Coordinators(cmd.Context())
				if err != nil {
					return err
				}
				if coordFlags.addr == "" {
					if lc, err := localCluster(); err == nil {
						list = withDown(list, lc.Coordinators)
					}
				}
				return printList(cmd.OutOrStdout(), asJSON, list, table.Coordinators)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// withDown adds to list the coordinators of a local cluster that are not
// in it: they do not run.
func withDown(list []coordv1.Coordinator, local []testbed.Coord) []coordv1.Coordinator {
	for _, lc := range local {
		if !slices.ContainsFunc(list, func(c coordv1.Coordinator) bool { return c.Name == lc.Name }) {
			list = append(list, coordv1.Coordinator{Name: lc.Name, Addr: lc.Addr})
		}
	}
	slices.SortFunc(list, func(a, b coordv1.Coordinator) int { return strings.Compare(a.Name, b.Name) })
	return list
}

// isTierURL says whether s names a durable tier rather than a checkpoint
// number.
func isTierURL(s string) bool {
	return strings.HasPrefix(s, "s3://") || strings.HasPrefix(s, "file://")
}

func newFlushCmd() *cobra.Command {
	var tierURL string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "flush JOB[:SEQ] [--tier URL]",
		Short: "Flush a job's checkpoint to its durable tier (an object store, a shared file system)",
		Long: `Flush checkpoint SEQ of JOB (default: the newest restorable one) to the job's
durable tier (cairn run --tier), or to --tier URL: s3://BUCKET[/PREFIX] for an
S3-compatible object store (AWS S3, Ceph RGW, MinIO, SeaweedFS), file:///DIR
for a shared file system. The job's images go under JOB/ there. Each rank's
image is uploaded by a node that holds it, only the chunks the tier lacks,
then the checkpoint's record: the tier never lists a checkpoint it cannot
give back whole. cairn restart JOB --from URL restarts the job from there on
any cluster. The agents reach the tier with the credentials of their own
environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL_S3, or
AWS_SHARED_CREDENTIALS_FILE): never in a URL, the catalog or a log.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			job, seqS, hasSeq := strings.Cut(args[0], ":")
			req := coordv1.Flush{Tier: tierURL}
			if hasSeq {
				seq, err := strconv.Atoi(seqS)
				if err != nil || seq < 1 {
					return usageError{fmt.Errorf("checkpoint %q: want JOB or JOB:SEQ", args[0])}
				}
				req.Seq = seq
			}
			return withCoord(func(c *rpc.CoordClient) error {
				ck, err := c.Flush(cmd.Context(), job, req)
				if err != nil {
					return goesOn(cmd.Context(), err, "flush of job "+job, "`"+cairnCmd()+" checkpoints "+job+"`")
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), ck)
				}
				f := ck.Flushed
				fmt.Fprintf(cmd.OutOrStdout(), "checkpoint %s:%d flushed to %s in %s: %s uploaded, %d of %d chunks new\n",
					ck.Job, ck.Seq, coordv1.TierRepo(f.URL, ck.Job), human.Duration(f.Duration), human.Bytes(f.Bytes), f.NewChunks, f.Chunks)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&tierURL, "tier", "", "the durable tier to flush to (default: the job's --tier)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the checkpoint as JSON")
	return cmd
}
