package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

func newLogsCmd() *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs NAME | JOB/RANK",
		Short: "Print a container's or a job rank's output (stdout and stderr)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.Contains(args[0], "/") {
				return jobLogs(cmd, args[0], follow)
			}
			m, err := manager()
			if err != nil {
				return err
			}
			in, err := m.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			f, err := os.Open(in.Log)
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			defer f.Close()
			out := cmd.OutOrStdout()
			if _, err := io.Copy(out, f); err != nil {
				return err
			}
			for follow {
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(100 * time.Millisecond):
				}
				if _, err := io.Copy(out, f); err != nil {
					return err
				}
				in, err := m.Get(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if in.Status != "running" && in.Status != "paused" {
					_, err := io.Copy(out, f)
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new output until the container stops")
	return cmd
}

func newRmCmd() *cobra.Command {
	var force bool
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
			for _, name := range args {
				if c, ok := asJob(cmd.Context(), name); ok {
					out, err := c.RemoveJob(cmd.Context(), name, force)
					c.Close()
					if err != nil {
						errs = append(errs, err)
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s: removed the job, %d ranks, %d checkpoints and %d rank images on live nodes\n", name, out.Ranks, out.Ckpts, out.Images)
					continue
				}
				if err := m.Remove(cmd.Context(), name, force); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), name)
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "kill running containers first")
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
			s, err := parseSignal(sig)
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
			return m.Kill(cmd.Context(), args[0], s)
		},
	}
	cmd.Flags().StringVarP(&sig, "signal", "s", "KILL", "signal name or number")
	return cmd
}

func parseSignal(s string) (syscall.Signal, error) {
	var n int
	if _, err := fmt.Sscanf(s, "%d", &n); err == nil && n > 0 && n < 65 {
		return syscall.Signal(n), nil
	}
	names := map[string]syscall.Signal{"KILL": syscall.SIGKILL, "TERM": syscall.SIGTERM, "INT": syscall.SIGINT,
		"HUP": syscall.SIGHUP, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "STOP": syscall.SIGSTOP, "CONT": syscall.SIGCONT, "QUIT": syscall.SIGQUIT}
	if len(s) > 3 && s[:3] == "SIG" {
		s = s[3:]
	}
	if sig, ok := names[s]; ok {
		return sig, nil
	}
	return 0, fmt.Errorf("unknown signal %q", s)
}

func newWaitCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "wait NAME",
		Short: "Wait until a container stops (or every rank of a job); exit with its exit code",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if c, ok := asJob(cmd.Context(), args[0]); ok {
				defer c.Close()
				return jobWait(cmd, c, args[0])
			}
			m, err := manager()
			if err != nil {
				return err
			}
			in, err := m.Wait(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), statusText(in))
			if in.Exit != nil && in.Exit.Code != 0 {
				return exitCodeError{in.Exit.Code}
			}
			return nil
		},
	}
}

func newExecCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "exec NAME -- CMD [ARGS...]",
		Short: "Run a command inside a running container",
		Long: `Run CMD inside a running container with this terminal's stdio, and exit with
its exit code. Note: a process started this way holds host files as stdio, so
checkpoint the container only after it has ended.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			code, err := m.Exec(cmd.Context(), args[0], args[1:], os.Stdin, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if code != 0 {
				return exitCodeError{code}
			}
			return nil
		},
	}
}
