package main

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"

	"github.com/spf13/cobra"

	"cairn/internal/pki"
)

// pkiDir is where the cluster CA lives in a data dir.
func pkiDir() string { return filepath.Join(global.dataDir, "pki") }

func newInitCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "init [--force]",
		Short: "Create the cluster's certificate authority (in DATA/pki)",
		Long: `Create a new cluster: a certificate authority that signs the credentials of
the coordinator, the agents and the CLI (cairn node cert). Nodes with
credentials of another cluster, or none, cannot join or call anything.
--force replaces an existing CA: every credential it issued stops working.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ca, err := pki.Init(pkiDir(), pki.InitOptions{Force: force})
			if errors.Is(err, pki.ErrExists) {
				return fmt.Errorf("%w (in %s); use --force to replace it, which invalidates every credential it issued", err, pkiDir())
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cluster %s: CA in %s (valid until %s)\n", ca.ClusterID, pkiDir(), ca.Cert.NotAfter.Format("2006-01-02"))
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "replace an existing CA")
	return cmd
}

func newNodeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Manage cluster nodes",
	}
	var role, out string
	var ips []string
	cert := &cobra.Command{
		Use:   "cert NAME -o DIR [--role agent|coordinator|client] [--ip IP]...",
		Short: "Issue credentials for a node (or the coordinator, or a CLI user)",
		Long: `Issue credentials signed by the cluster CA (cairn init) and write them to DIR:
node.crt, node.key (0600) and ca.crt. NAME is a lowercase DNS label. An agent
or the coordinator gets a certificate for both ends of a connection; a client
(CLI) only for calling.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return usageError{errors.New("-o DIR is required")}
			}
			r, err := pki.ParseRole(role)
			if err != nil {
				return usageError{err}
			}
			var parsed []net.IP
			for _, s := range ips {
				ip := net.ParseIP(s)
				if ip == nil {
					return usageError{fmt.Errorf("--ip %q is not an IP address", s)}
				}
				parsed = append(parsed, ip)
			}
			ca, err := pki.Load(pkiDir())
			if errors.Is(err, pki.ErrNotFound) {
				return fmt.Errorf("%w: no cluster CA in %s; run `%s init` first", err, pkiDir(), cairnCmd())
			}
			if err != nil {
				return err
			}
			creds, err := ca.Issue(args[0], r, pki.IssueOptions{IPs: parsed})
			if err != nil {
				if errors.Is(err, pki.ErrInvalidName) {
					return usageError{err}
				}
				return err
			}
			if err := creds.Write(out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s of cluster %s: credentials in %s (valid until %s)\n",
				creds.Role, creds.Name, creds.ClusterID, out, creds.Cert.NotAfter.Format("2006-01-02"))
			return nil
		},
	}
	cert.Flags().StringVar(&role, "role", "agent", "agent, coordinator or client")
	cert.Flags().StringVarP(&out, "output", "o", "", "directory to write the credentials to (required)")
	cert.Flags().StringSliceVar(&ips, "ip", nil, "IP address the certificate is valid for (repeatable)")
	cmd.AddCommand(cert, newNodeSpareCmd(), newNodeFailCmd(), newNodeReviveCmd(), newNodeUndrainCmd())
	return cmd
}
