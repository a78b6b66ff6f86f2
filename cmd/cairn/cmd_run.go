package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"cairn/internal/container"
)

func newRunCmd() *cobra.Command {
	var cfg container.Config
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "run --name NAME [--rootfs DIR] [--env K=V]... -- CMD [ARGS...]",
		Short: "Start a command in a new container",
		Long: `Start CMD in a new container named NAME: an overlay root (the host's / unless
--rootfs gives another lower layer), its own pid, mount, uts, ipc and network
namespaces, a cgroup, and an address on the node bridge. The container runs in
the background; its output goes to its log (cairn logs NAME).`,
		Example: `  cairn run --name sim -- /usr/bin/python3 -c 'import time; time.sleep(1e9)'
  cairn run --name sim --env OMP_NUM_THREADS=2 --rootfs /srv/rootfs -- ./solver`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cfg.Name == "" {
				return usageError{fmt.Errorf("--name is required")}
			}
			if len(args) == 0 {
				return usageError{fmt.Errorf("no command given: cairn run --name NAME -- CMD [ARGS...]")}
			}
			for _, kv := range cfg.Env {
				if !strings.Contains(kv, "=") {
					return usageError{fmt.Errorf("--env %q: want KEY=VALUE", kv)}
				}
			}
			cfg.Args = args
			m, err := manager()
			if err != nil {
				return err
			}
			in, err := m.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), in)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s running (pid %d, address %s)\n", in.Name, in.Pid, in.Addr)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Name, "name", "", "container name (required)")
	f.StringVar(&cfg.RootFS, "rootfs", "", "lower layer of the container's root (default: the host's /)")
	f.StringArrayVarP(&cfg.Env, "env", "e", nil, "set an environment variable KEY=VALUE (repeatable)")
	f.StringVar(&cfg.Hostname, "hostname", "", "hostname inside the container (default: its name)")
	f.StringVarP(&cfg.Cwd, "workdir", "w", "", "working directory inside the container (default /)")
	f.BoolVar(&asJSON, "json", false, "print the container as JSON")
	return cmd
}
