package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/control"
	"github.com/cairn-hpc/cairn/internal/durable"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

func newCatalogCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "catalog",
		Short: "Back up the cluster's catalog and event history, and restore a coordinator from a backup",
	}
	var out string
	var backupJSON bool
	backup := &cobra.Command{
		Use:   "backup -o FILE",
		Short: "Write a backup of the catalog (jobs, checkpoints, copies, nodes) and the event history to FILE",
		Long: `Ask the coordinator for a backup of the cluster's catalog, every record at one
revision but those that only live as long as a process (nodes alive, the
leader), and of its kept event history, and write it to FILE (a tar;
replaced only once the whole backup is there and checked to be one). Jobs run on meanwhile.

'cairn catalog restore FILE --dir DIR' makes DIR the state dir of a
coordinator that starts from it (docs/operations.md, "Backup and restore").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return usageError{errors.New("-o FILE is required")}
			}
			return withCoord(func(c *rpc.CoordClient) error {
				rc, err := c.Backup(cmd.Context())
				if err != nil {
					return err
				}
				defer rc.Close()
				b, err := io.ReadAll(rc)
				if err != nil {
					return fmt.Errorf("backup: %w", err)
				}
				info, err := backupInfo(b)
				if err != nil {
					return err
				}
				if err := durable.WriteFile(out, b, 0o600); err != nil {
					return err
				}
				if backupJSON {
					return printJSON(cmd.OutOrStdout(), info)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "backup of cluster %s in %s: %d records (revision %d), %d events\n",
					info.Cluster, out, info.Keys, info.Revision, info.Events)
				return nil
			})
		},
	}
	backup.Flags().StringVarP(&out, "output", "o", "", "file to write the backup to (required)")
	backup.Flags().BoolVar(&backupJSON, "json", false, "print what the backup holds as JSON")

	var dir string
	var restoreJSON bool
	restore := &cobra.Command{
		Use:   "restore FILE --dir DIR",
		Short: "Make DIR the state dir of a coordinator that starts from a backup",
		Long: `Read a backup ('cairn catalog backup') and make DIR the state dir of a
coordinator that starts from it: an embedded etcd in DIR/etcd holding its
catalog, and its event history in DIR/events.jsonl. DIR must hold no
coordinator's state. The whole backup is checked before anything is
written; whatever fails leaves DIR as it was.

Then start one coordinator with --dir DIR (no --peers: a restored catalog
has one member). The agents join it again, and the jobs, checkpoints and
copies are the backup's; what happened after the backup was taken is not in
it. The coordinators' term starts afresh, so agents take the restored
coordinator's calls. Run it where no other coordinator of the cluster runs.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return usageError{errors.New("--dir DIR is required")}
			}
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			info, err := control.Restore(cmd.Context(), f, dir)
			if err != nil {
				return err
			}
			if restoreJSON {
				return printJSON(cmd.OutOrStdout(), info)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "restored cluster %s's catalog of %s (%d records, %d events) into %s; start the coordinator with --dir %s\n",
				info.Cluster, info.Time.Format("2006-01-02 15:04:05Z"), info.Keys, info.Events, dir, dir)
			return nil
		},
	}
	restore.Flags().StringVar(&dir, "dir", "", "the restored coordinator's state dir (required; must hold no coordinator's state)")
	restore.Flags().BoolVar(&restoreJSON, "json", false, "print what was restored as JSON")
	cmd.AddCommand(backup, restore)
	return cmd
}

// backupInfo reads a backup's backup.json, its first file.
func backupInfo(b []byte) (coordv1.BackupInfo, error) {
	var info coordv1.BackupInfo
	tr := tar.NewReader(bytes.NewReader(b))
	h, err := tr.Next()
	if err != nil || h.Name != "backup.json" {
		return info, fmt.Errorf("the coordinator sent no cairn backup (%v)", err)
	}
	return info, json.NewDecoder(tr).Decode(&info)
}
