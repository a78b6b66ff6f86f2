package main

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/cairn-hpc/cairn/internal/pki"
)

// pkiDir is where the cluster CA lives in a data dir.
func pkiDir() string { return filepath.Join(global.dataDir, "pki") }

// caInfo is what `cairn init --json` prints.
type caInfo struct {
	Cluster string    `json:"cluster"`
	Dir     string    `json:"dir"`
	Until   time.Time `json:"valid_until"`
}

// credsInfo is what `cairn node cert --json` prints.
type credsInfo struct {
	Name    string    `json:"name"`
	Role    pki.Role  `json:"role"`
	Cluster string    `json:"cluster"`
	Dir     string    `json:"dir"`
	Until   time.Time `json:"valid_until"`
	Renewed bool      `json:"renewed,omitempty"`
}

func newInitCmd() *cobra.Command {
	var force, asJSON bool
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
			if asJSON {
				return printJSON(cmd.OutOrStdout(), caInfo{ca.ClusterID, pkiDir(), ca.Cert.NotAfter})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cluster %s: CA in %s (valid until %s)\n", ca.ClusterID, pkiDir(), ca.Cert.NotAfter.Format("2006-01-02"))
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "replace an existing CA")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the cluster's id and CA as JSON")
	return cmd
}

// renewCreds issues the renewal of the credentials in dir, which must be
// this CA's and, if args names one, of that name.
func renewCreds(ca *pki.CA, dir string, args []string) (*pki.Credentials, error) {
	old, err := pki.LoadCredentials(dir)
	if err != nil {
		return nil, fmt.Errorf("renew: %w", err)
	}
	if len(args) == 1 && args[0] != old.Name {
		return nil, usageError{fmt.Errorf("the credentials in %s are %s's, not %s's", dir, old.Name, args[0])}
	}
	return ca.Renew(old.Cert(), pki.IssueOptions{})
}

func newNodeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Manage cluster nodes",
	}
	var role, out string
	var ips []string
	var renew, asJSON bool
	cert := &cobra.Command{
		Use:   "cert NAME -o DIR [--role agent|coordinator|client] [--ip IP]... | cert --renew -o DIR",
		Short: "Issue credentials for a node (or the coordinator, or a CLI user), or renew them",
		Long: `Issue credentials signed by the cluster CA (cairn init) and write them to DIR:
node.crt, node.key (0600) and ca.crt. NAME is a lowercase DNS label. An agent
or the coordinator gets a certificate for both ends of a connection; a client
(CLI) only for calling.

--renew issues a new certificate and key for the credentials in DIR, with
their name, role and addresses, valid for a year from now (never beyond the
CA), and replaces them. A running daemon takes them at its next handshake
once it has read them again: at once on SIGHUP (systemctl reload), else
within a minute; no restart. An expired certificate can be renewed too.`,
		Args: cobra.RangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return usageError{errors.New("-o DIR is required")}
			}
			if !renew && len(args) == 0 {
				return usageError{errors.New("NAME is required (or --renew, to renew the credentials in -o DIR)")}
			}
			if renew && (cmd.Flags().Changed("role") || cmd.Flags().Changed("ip")) {
				return usageError{errors.New("--renew keeps the role and addresses of the certificate in -o DIR: give neither --role nor --ip")}
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
			var creds *pki.Credentials
			if renew {
				creds, err = renewCreds(ca, out, args)
			} else {
				creds, err = ca.Issue(args[0], r, pki.IssueOptions{IPs: parsed})
			}
			if err != nil {
				if errors.Is(err, pki.ErrInvalidName) {
					return usageError{err}
				}
				return err
			}
			if err := creds.Write(out); err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), credsInfo{creds.Name, creds.Role, creds.ClusterID, out, creds.Cert().NotAfter, renew})
			}
			what := "credentials in"
			if renew {
				what = "renewed credentials in"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s of cluster %s: %s %s (valid until %s)\n",
				creds.Role, creds.Name, creds.ClusterID, what, out, creds.Cert().NotAfter.Format("2006-01-02"))
			return nil
		},
	}
	cert.Flags().BoolVar(&asJSON, "json", false, "print what was written as JSON")
	cert.Flags().BoolVar(&renew, "renew", false, "renew the credentials in -o DIR: a new key and certificate, same name, role and addresses")
	cert.Flags().StringVar(&role, "role", "agent", "agent, coordinator or client")
	cert.Flags().StringVarP(&out, "output", "o", "", "directory to write the credentials to (required)")
	cert.Flags().StringSliceVar(&ips, "ip", nil, "IP address the certificate is valid for (repeatable)")
	cmd.AddCommand(cert, newNodeSpareCmd(), newNodeFailCmd(), newNodeReviveCmd(), newNodeUndrainCmd())
	return cmd
}
