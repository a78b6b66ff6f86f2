package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/spf13/cobra"

	"cairn/internal/agent"
	"cairn/internal/pki"
)

func newAgentCmd() *cobra.Command {
	var listen, creds string
	cmd := &cobra.Command{
		Use:   "agent --listen ADDR --creds DIR",
		Short: "Serve this node's containers and checkpoints over the agent API (mutual TLS)",
		Long: `Run the node agent in the foreground: it serves this node's containers,
checkpoints and restores (the data dir of --data) over the agent API
(api/agent/v1: JSON over HTTPS, TLS 1.3 with client certificates). DIR holds
the node's credentials from 'cairn node cert NAME --role agent -o DIR'. Only
the cluster's coordinator and clients may call it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if creds == "" {
				return usageError{errors.New("--creds DIR is required")}
			}
			c, err := pki.LoadCredentials(creds)
			if err != nil {
				return err
			}
			if c.Role != pki.Agent {
				return fmt.Errorf("credentials in %s are for a %s, not an agent", creds, c.Role)
			}
			m, err := manager()
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			log.Info("agent serving", "node", c.Name, "addr", ln.Addr().String(), "cluster", c.ClusterID)
			return (&agent.Server{Manager: m, Creds: c, Logger: log}).Serve(cmd.Context(), ln)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:7420", "address to serve on")
	cmd.Flags().StringVar(&creds, "creds", "", "directory with the node's credentials (required)")
	return cmd
}
