package main

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/spf13/cobra"

	"github.com/cairn-hpc/cairn/internal/netw"
)

func newSystemCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "system",
		Short: "What cairn leaves on this machine",
		Args:  cobra.NoArgs,
	}
	var asJSON bool
	prune := &cobra.Command{
		Use:   "prune",
		Short: "Remove the node bridge and its nftables guard once no container uses them",
		Long: `Remove what single containers leave on this machine once none uses it: the
node bridge (--bridge, cairn0 by default) and its nftables table
(cairn_guard_BRIDGE). A bridge any container is still attached to (of
this data dir or another) is left as it is, and says so. The next 'cairn
run' makes them again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			subnet, err := netip.ParsePrefix(global.subnet)
			if err != nil {
				return usageError{fmt.Errorf("--subnet: %w", err)}
			}
			b := netw.Bridge{Name: global.bridge, Subnet: subnet.Masked()}
			out := struct {
				Bridge  string   `json:"bridge"`
				Removed bool     `json:"removed"`
				InUse   []string `json:"in_use,omitempty"` // attached interfaces
			}{Bridge: b.Name}
			ports, err := b.Ports()
			if err != nil {
				return err
			}
			switch {
			case len(ports) > 0:
				out.InUse = ports
			case !netw.LinkExists(b.Name):
				// Nothing to remove but, perhaps, a guard left behind.
				if err := b.Delete(cmd.Context()); err != nil {
					return err
				}
			default:
				if err := b.Delete(cmd.Context()); err != nil {
					return fmt.Errorf("remove bridge %s: %w", b.Name, err)
				}
				out.Removed = true
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), out)
			}
			switch {
			case out.Removed:
				fmt.Fprintf(cmd.OutOrStdout(), "removed bridge %s and its guard %s\n", b.Name, netw.GuardTable(b.Name))
			case len(out.InUse) > 0:
				fmt.Fprintf(cmd.OutOrStdout(), "bridge %s is in use by %d containers (%v): left as it is\n", b.Name, len(out.InUse), out.InUse)
			default:
				fmt.Fprintf(cmd.OutOrStdout(), "no bridge %s: nothing to remove\n", b.Name)
			}
			return nil
		},
	}
	prune.Flags().BoolVar(&asJSON, "json", false, "print what was done as JSON")
	cmd.AddCommand(prune)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return usageError{errors.New("name a subcommand: cairn system prune")}
	}
	return cmd
}
