package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

// completeNames completes a container of this node or a job of the
// cluster (what NAME means to logs, wait, kill, rm, checkpoint...), while
// no name is given yet: the shell's completion asks cairn itself
// (`cairn __complete ...`), so names come from this data dir and the
// cluster it finds.
func completeNames(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return filterPrefix(append(containerNames(cmd.Context()), jobNames(cmd.Context())...), prefix), cobra.ShellCompDirectiveNoFileComp
}

// completeJobs completes a job of the cluster.
func completeJobs(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return filterPrefix(jobNames(cmd.Context()), prefix), cobra.ShellCompDirectiveNoFileComp
}

// completeNodes completes a node of the cluster, the first argument.
func completeNodes(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return completeNode(cmd, args, prefix)
}

// completeNode completes a node of the cluster, whatever the arguments
// (a flag's value).
func completeNode(cmd *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
	return filterPrefix(nodeNames(cmd.Context()), prefix), cobra.ShellCompDirectiveNoFileComp
}

// completeNodeList completes the last of a comma-separated list of the
// cluster's nodes (--nodes, --placement).
func completeNodeList(cmd *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
	done, last := "", prefix
	if i := strings.LastIndexByte(prefix, ','); i >= 0 {
		done, last = prefix[:i+1], prefix[i+1:]
	}
	var out []string
	for _, n := range filterPrefix(nodeNames(cmd.Context()), last) {
		out = append(out, done+n)
	}
	return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
}

// completeCkpts completes NAME:SEQ of this node's checkpoints and
// JOB:SEQ of the cluster's jobs' checkpoints, once NAME: is typed (a
// name first).
func completeCkpts(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	name, _, ok := strings.Cut(prefix, ":")
	if !ok {
		names := append(containerNames(cmd.Context()), jobNames(cmd.Context())...)
		for i := range names {
			names[i] += ":"
		}
		return filterPrefix(names, prefix), cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
	}
	var out []string
	if m, err := readManager(); err == nil {
		recs, _ := m.Repo().List(name) // what lists, despite damage elsewhere
		for _, r := range recs {
			out = append(out, r.Name())
		}
	}
	if c, err := coordClient(); err == nil {
		ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Second)
		if cks, err := c.Checkpoints(ctx, name); err == nil {
			for _, ck := range cks {
				out = append(out, ck.Job+":"+strconv.Itoa(ck.Seq))
			}
		}
		cancel()
		c.Close()
	}
	return filterPrefix(out, prefix), cobra.ShellCompDirectiveNoFileComp
}

// containerNames lists this node's containers, changing nothing: no data
// dir is made, and nothing an interrupted checkpoint left is released
// (manager does both).
func containerNames(ctx context.Context) []string {
	m, err := readManager()
	if err != nil {
		return nil
	}
	list, err := m.List(ctx)
	if err != nil {
		return nil
	}
	var out []string
	for _, in := range list {
		out = append(out, in.Name)
	}
	return out
}

// jobNames lists the cluster's jobs, if a cluster answers within 2 s.
func jobNames(ctx context.Context) []string {
	return clusterNames(ctx, func(ctx context.Context, c *rpc.CoordClient) (out []string, err error) {
		js, err := c.Jobs(ctx)
		for _, j := range js {
			out = append(out, j.Name)
		}
		return out, err
	})
}

// nodeNames lists the cluster's nodes, if a cluster answers within 2 s.
func nodeNames(ctx context.Context) []string {
	return clusterNames(ctx, func(ctx context.Context, c *rpc.CoordClient) (out []string, err error) {
		ns, err := c.Nodes(ctx)
		for _, n := range ns {
			out = append(out, n.Name)
		}
		return out, err
	})
}

// clusterNames asks the cluster for names with list, within 2 s; none
// if no cluster answers.
func clusterNames(ctx context.Context, list func(context.Context, *rpc.CoordClient) ([]string, error)) []string {
	c, err := coordClient()
	if err != nil {
		return nil
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	out, err := list(ctx, c)
	if err != nil {
		return nil
	}
	return out
}

func filterPrefix(names []string, prefix string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}

// addCompletions gives the commands that take names their completion of
// names: containers and jobs, jobs, checkpoints or nodes, as arguments
// and as the flags that name nodes.
func addCompletions(root *cobra.Command) {
	many := func(f cobra.CompletionFunc) cobra.CompletionFunc {
		return func(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
			return f(cmd, nil, prefix) // every argument is one more name
		}
	}
	byPath := map[string]cobra.CompletionFunc{
		"logs": completeNames, "exec": completeNames, "kill": completeNames, "wait": completeNames,
		"inspect": completeNames, "checkpoint": completeNames, "checkpoints": completeNames,
		"rm": many(completeNames), "restart": completeJobs, "flush": completeJobs,
		"restore": completeCkpts, "export": completeCkpts, "verify": completeNames,
		"checkpoint pin": many(completeCkpts), "checkpoint unpin": many(completeCkpts), "checkpoint rm": many(completeCkpts),
		"drain": completeNodes, "node spare": completeNodes, "node undrain": completeNodes,
		"node fail": completeNodes, "node revive": completeNodes,
	}
	flags := map[string]map[string]cobra.CompletionFunc{
		"migrate": {"to": completeNode},
		"run":     {"nodes": completeNodeList},
		"restart": {"nodes": completeNodeList, "placement": completeNodeList},
	}
	var walk func(c *cobra.Command, path string)
	walk = func(c *cobra.Command, path string) {
		for _, sub := range c.Commands() {
			p := strings.TrimSpace(path + " " + sub.Name())
			if f, ok := byPath[p]; ok && sub.ValidArgsFunction == nil {
				sub.ValidArgsFunction = f
			}
			for flag, f := range flags[p] {
				_ = sub.RegisterFlagCompletionFunc(flag, f)
			}
			walk(sub, p)
		}
	}
	walk(root, "")
}

// readManager opens an existing data dir to read it.
func readManager() (*container.Manager, error) {
	if _, err := os.Stat(global.dataDir); err != nil {
		return nil, err
	}
	opts, err := containerOptions()
	if err != nil {
		return nil, err
	}
	return container.New(opts)
}
