// Command cairn is cairn's one binary. As the CLI it parses a command's
// flags and arguments, calls the packages that do the work (container and
// image on this node, rpc for the cluster, agent and control for the
// daemons, testbed for the local cluster, demo) and prints what they
// return, as tables (package table) or JSON; errors become exit codes and
// messages here, in main.go, only. The same binary is what cairn runs
// elsewhere: a container's shim, an MPI rank's init (cairn rankinit) and
// its launchers' agent (cairn rsh), and the test programs of demos and
// tests (cairn stateapp, cairn ringapp).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/chaos"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/criu"
	"github.com/cairn-hpc/cairn/internal/human"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/launch"
	"github.com/cairn-hpc/cairn/internal/names"
	"github.com/cairn-hpc/cairn/internal/netw"
	"github.com/cairn-hpc/cairn/internal/plan"
	"github.com/cairn-hpc/cairn/internal/rankclient"
	"github.com/cairn-hpc/cairn/internal/testbed"
	"github.com/cairn-hpc/cairn/internal/version"
)

// globalOptions are the flags every command takes.
type globalOptions struct {
	dataDir     string
	stagingDir  string
	criuPath    string
	runcPath    string
	bridge      string
	subnet      string
	debug       bool
	hide        []string // host paths containers never see
	dumpTimeout time.Duration
	keepImages  string
}

var global globalOptions

// usageError marks errors in how cairn was called (exit code 2).
type usageError struct{ error }

// exitCodeError carries the exit code of a process cairn ran (cairn exec).
type exitCodeError struct{ code int }

func (e exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Exit codes of cairn's own failures in a command that otherwise exits
// with its child's code (exec, wait), as podman's: a script tells them
// apart from the child's.
const (
	exitOwnFailure    = 125 // cairn failed: no such container, not running, ...
	exitNotExecutable = 126 // the command is there but cannot be run
	exitNotFound      = 127 // no such command in the container
)

// ownError is an error of cairn's own in a command whose exit code is
// otherwise its child's.
type ownError struct {
	error
	code int
}

// asOwnError marks err, if any, as cairn's own failure in a command
// that exits with its child's code.
func asOwnError(err error) error {
	var ec exitCodeError
	switch {
	case err == nil, errors.As(err, &ec):
		return err
	}
	var we *agentv1.Error
	switch {
	case errors.Is(err, container.ErrExecNotFound), errors.As(err, &we) && we.Code == agentv1.CodeExecNotFound:
		return ownError{err, exitNotFound}
	case errors.Is(err, container.ErrExecNotExecutable), errors.As(err, &we) && we.Code == agentv1.CodeExecNotExecutable:
		return ownError{err, exitNotExecutable}
	}
	return ownError{err, exitOwnFailure}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "cairn",
		Short: "Run jobs in containers and make them survive failures",
		Long: `cairn runs each rank of a job in a lightweight container (runc) and
checkpoints it transparently with CRIU: processes, memory, TCP connections and
the files it wrote. A checkpoint can be restored on this node, under the same
or a new name.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&global.dataDir, "data", envOr("CAIRN_DATA", container.DefaultDataDir), "data dir for containers, logs and checkpoints ($CAIRN_DATA)")
	pf.StringVar(&global.stagingDir, "staging", envOr("CAIRN_STAGING", container.DefaultStagingDir), "staging dir for dumps, best on tmpfs ($CAIRN_STAGING)")
	pf.StringVar(&global.criuPath, "criu", "", "CRIU binary (default "+criu.DefaultPath+", then PATH) ($"+criu.EnvPath+")")
	pf.StringVar(&global.runcPath, "runc", envOr("CAIRN_RUNC", "runc"), "runc binary ($CAIRN_RUNC)")
	pf.StringVar(&global.bridge, "bridge", envOr("CAIRN_BRIDGE", container.DefaultBridge), "node bridge containers attach to ($CAIRN_BRIDGE)")
	pf.StringVar(&global.subnet, "subnet", envOr("CAIRN_SUBNET", container.DefaultSubnet), "subnet of the node bridge ($CAIRN_SUBNET)")
	pf.BoolVar(&global.debug, "debug", false, "log what cairn does to stderr")
	pf.DurationVar(&global.dumpTimeout, "dump-timeout", container.DefaultDumpTimeout, "kill a checkpoint's CRIU dump that runs longer, and resume the container")
	pf.StringSliceVar(&global.hide, "hide", envList("CAIRN_HIDE", ":"), "host path no container sees, besides cairn's own dirs and the host's secrets; repeatable ($CAIRN_HIDE, ':'-separated)")
	pf.UintSliceVar(&hostPortFlags, "allow-host-port", nil, "TCP port of the host that containers may connect to (default none); repeatable ($CAIRN_ALLOW_HOST_PORTS)")
	pf.StringVar(&coordFlags.addr, "coordinator", os.Getenv("CAIRN_COORDINATOR"), "coordinator of the cluster, or several separated by commas (default: the local cluster of 'cairn up') ($CAIRN_COORDINATOR)")
	pf.StringVar(&coordFlags.creds, "creds", os.Getenv("CAIRN_CREDS"), "credentials directory ($CAIRN_CREDS)")
	nameVars(pf, "CAIRN_")
	root.PersistentPreRunE = envPreRun(root)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(
		newRunCmd(), newPsCmd(), newInspectCmd(), newLogsCmd(), newRmCmd(), newExecCmd(), newKillCmd(), newWaitCmd(),
		newCheckpointCmd(), newCheckpointsCmd(), newRestoreCmd(), newVerifyCmd(),
		newGCCmd(), newDuCmd(), newExportCmd(), newImportCmd(), newPlanCmd(), newReportCmd(),
		newInitCmd(), newNodeCmd(), newAgentCmd(), newCoordinatorCmd(), newUpCmd(), newDownCmd(),
		newJobsCmd(), newNodesCmd(), newCoordinatorsCmd(), newRestartCmd(), newFlushCmd(), newSlurmCmd(), newEventsCmd(), newMigrateCmd(), newMigrationsCmd(), newDrainCmd(),
		newCheckCmd(), newDemoCmd(), newChaosCmd(), newStateappCmd(), newRingappCmd(), newVersionCmd(), newRankCmd(), newSystemCmd(),
		newManPagesCmd(), newCatalogCmd(),
	)
	addCompletions(root)
	root.Version = version.Get().String()
	root.SetVersionTemplate("{{.Version}}\n")
	return root
}

// checkName refuses, as a usage error, a container or job name that
// cannot exist, before anything is looked up or made for it.
func checkName(name string) error {
	if err := names.Container(name); err != nil {
		return usageError{err}
	}
	return nil
}

// hostPortFlags holds --allow-host-port before it is checked.
var hostPortFlags []uint

// envList splits $key at sep; nil when unset.
func envList(key, sep string) []string {
	v := os.Getenv(key)
	if v == "" {
		return nil
	}
	return strings.Split(v, sep)
}

// hostPorts checks --allow-host-port and $CAIRN_ALLOW_HOST_PORTS.
func hostPorts() ([]uint16, error) {
	ports, err := netw.HostPorts(hostPortFlags, os.Getenv("CAIRN_ALLOW_HOST_PORTS"))
	if err != nil {
		return nil, usageError{err}
	}
	return ports, nil
}

// cairnCmd is how to call cairn again for what this call works on, for hints:
// "cairn", with --data when the data dir is not the default one (a hint
// to run `cairn down` after `cairn --data X up` must say --data X).
func cairnCmd() string {
	if global.dataDir == container.DefaultDataDir || global.dataDir == "" {
		return "cairn"
	}
	return "cairn --data " + shellQuote(global.dataDir)
}

// shellQuote quotes s for a POSIX shell if it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:@%+,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// prefix is where cairn's setup installs what it builds ($CAIRN_PREFIX,
// default /opt/cairn): CRIU, the MPICH fix, the tools of MPI ranks.
func prefix() string { return envOr("CAIRN_PREFIX", "/opt/cairn") }

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// manager opens the data dir with the global flags, releasing first the
// containers an interrupted checkpoint left frozen (Manager.Recover).
func manager() (*container.Manager, error) {
	opts, err := containerOptions()
	if err != nil {
		return nil, err
	}
	m, err := container.New(opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.Recover(ctx); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return m, nil
}

// containerOptions are the global flags' options of a Manager.
func containerOptions() (container.Options, error) {
	subnet, err := netip.ParsePrefix(global.subnet)
	if err != nil {
		return container.Options{}, usageError{fmt.Errorf("--subnet: %w", err)}
	}
	logger := slog.New(slog.DiscardHandler)
	if global.debug {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ports, err := hostPorts()
	if err != nil {
		return container.Options{}, err
	}
	var keep int64 // only agents keep images (cmd_agent.go)
	if global.keepImages != "" {
		if keep, err = human.ParseBytes(global.keepImages); err != nil {
			return container.Options{}, usageError{fmt.Errorf("--keep-images: %w", err)}
		}
	}
	return container.Options{
		KeepImages:  keep,
		DataDir:     global.dataDir,
		StagingDir:  global.stagingDir,
		CRIU:        global.criuPath,
		Runc:        global.runcPath,
		Bridge:      netw.Bridge{Name: global.bridge, Subnet: subnet.Masked(), HostPorts: ports},
		Hide:        global.hide,
		DumpTimeout: global.dumpTimeout,
		Logger:      logger,
	}, nil
}

func main() {
	// A shim is started with its spec in the environment.
	if os.Getenv(container.ShimEnv) != "" {
		os.Exit(container.ShimMain())
	}
	// Inside the ranks of an MPI job: the launch daemon and the agent MPI
	// launchers run. Their arguments are not cairn's flags (see
	// internal/launch).
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "rankinit":
			os.Exit(launch.RankInit(os.Args[2:], os.Stderr))
		case "rsh":
			os.Exit(launch.Rsh(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	os.Exit(exitCode(err))
}

// exitCode maps an error to cairn's exit code and prints it. This is the one
// place errors become user messages.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ec exitCodeError
	if errors.As(err, &ec) {
		return ec.code
	}
	fmt.Fprintln(os.Stderr, "cairn: error:", err)
	var oe ownError
	if errors.As(err, &oe) {
		return oe.code
	}
	var ue usageError
	var we *agentv1.Error // both APIs' errors
	wire := ""
	if errors.As(err, &we) {
		wire = we.Code
	}
	switch {
	case errors.As(err, &ue), errors.Is(err, names.ErrInvalid), errors.Is(err, container.ErrBadConfig), errors.Is(err, testbed.ErrBadConfig), errors.Is(err, chaos.ErrConfig), errors.Is(err, plan.ErrInput), wire == agentv1.CodeBadRequest, errors.Is(err, rankclient.ErrUsage), errors.Is(err, rankclient.ErrBadRequest):
		fmt.Fprintln(os.Stderr, "Run 'cairn --help' for usage.")
		return 2
	case errors.Is(err, container.ErrNotFound), errors.Is(err, image.ErrNotFound), wire == agentv1.CodeNotFound, errors.Is(err, rankclient.ErrNotFound):
		return 3
	case errors.Is(err, image.ErrCorrupt), wire == agentv1.CodeCorrupt:
		return 4
	case errors.Is(err, criu.ErrUnusable), wire == agentv1.CodeCRIU:
		return 5
	case errors.Is(err, context.Canceled):
		return 130
	}
	return 1
}
