package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/human"
	"github.com/cairn-hpc/cairn/internal/image"
	"github.com/cairn-hpc/cairn/internal/table"
)

func newGCCmd() *cobra.Command {
	var keep int
	var dryRun, asJSON bool
	cmd := &cobra.Command{
		Use:   "gc [--keep N] [--dry-run]",
		Short: "Delete old checkpoints and reclaim the space no checkpoint uses",
		Long: `Apply the retention policy: keep the newest N checkpoints of every container
(default 3) plus every pinned one (cairn checkpoint pin), delete the others,
and reclaim the chunks no remaining checkpoint uses by repacking the store.
Restores may run while gc does: gc waits for them before deleting any pack.

The images of a job's ranks on a node of a cluster are the cluster's: gc
keeps them all, and the job's retention (cairn run --keep, cairn checkpoint
rm JOB:SEQ) removes them from the catalog and every node.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			prog, done := progressBarOf("repacking", asJSON, "packs")
			damage := m.Repo().WatchQuarantine()
			res, err := m.Repo().GC(cmd.Context(), image.GCOptions{Keep: keep, DryRun: dryRun, Progress: prog, Retain: container.RankImage})
			done()
			if err != nil {
				return errors.Join(err, damage())
			}
			if asJSON {
				return errors.Join(printJSON(cmd.OutOrStdout(), res), damage())
			}
			w := cmd.OutOrStdout()
			verb := "removed"
			if dryRun {
				verb = "would remove"
			}
			for _, n := range res.Removed {
				fmt.Fprintf(w, "%s %s\n", verb, n)
			}
			if !dryRun {
				s := res.Store
				fmt.Fprintf(w, "kept %d checkpoints; store %s -> %s (%d chunks, %d manifests reclaimed; %d packs rewritten, %d deleted)\n",
					len(res.Kept), human.Bytes(s.BytesBefore), human.Bytes(s.BytesAfter), s.ChunksRemoved, s.ManifestsRemoved, s.PacksRewritten, s.PacksDeleted)
			}
			return damage()
		},
	}
	cmd.Flags().IntVar(&keep, "keep", 3, "checkpoints to keep per container, newest first (pinned ones are kept too)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only say what would be removed")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newDuCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "du",
		Short: "Show the space checkpoints take: logical, unique and stored bytes",
		Long: `For every checkpoint: its logical size (its files' bytes), the bytes of the
chunks it added that no earlier checkpoint uses (unique), and what they take
on disk after compression (stored). Then the store's totals with the
deduplication and compression ratios.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := manager()
			if err != nil {
				return err
			}
			du, err := m.Repo().DiskUsage(cmd.Context())
			if asJSON {
				if perr := printJSON(cmd.OutOrStdout(), du); perr != nil {
					return perr
				}
				return err
			}
			return errors.Join(table.DiskUsage(cmd.OutOrStdout(), du), err)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// exported is what `cairn export --json` says.
type exported struct {
	Checkpoint string `json:"checkpoint"`
	File       string `json:"file"`
	Logical    int64  `json:"logical_bytes"` // the image's files
	Bytes      int64  `json:"bytes"`         // the export file's
}

func newExportCmd() *cobra.Command {
	var out string
	var quiet, asJSON bool
	cmd := &cobra.Command{
		Use:   "export NAME:SEQ -o FILE",
		Short: "Write one checkpoint as a single self-contained file",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return usageError{errors.New("-o FILE is required")}
			}
			name, seq, err := container.ParseCheckpointRef(args[0], "")
			if err != nil || name == "" {
				return usageError{fmt.Errorf("bad checkpoint %q: want NAME:SEQ", args[0])}
			}
			m, err := manager()
			if err != nil {
				return err
			}
			prog, done := progressBarOf("exporting "+args[0], quiet || asJSON, "chunks")
			rec, err := m.Repo().ExportFile(cmd.Context(), name, seq, out, prog)
			done()
			if err != nil {
				return err
			}
			fi, err := os.Stat(out)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), exported{Checkpoint: rec.Name(), File: out, Logical: rec.Logical, Bytes: fi.Size()})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "exported %s (%s) to %s (%s)\n", rec.Name(), human.Bytes(rec.Logical), out, human.Bytes(fi.Size()))
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "file to write (required)")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print what was exported as JSON (no progress bar)")
	return cmd
}

func newImportCmd() *cobra.Command {
	var as string
	var quiet, asJSON bool
	cmd := &cobra.Command{
		Use:   "import FILE [--as NAME]",
		Short: "Add a checkpoint from an export file (verified before it is listed)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if as != "" {
				if err := container.ValidName(as); err != nil {
					return usageError{err}
				}
			}
			m, err := manager()
			if err != nil {
				return err
			}
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			prog, done := progressBarOf("importing", quiet || asJSON, "chunks")
			damage := m.Repo().WatchQuarantine()
			rec, err := m.Repo().Import(cmd.Context(), f, as, prog)
			done()
			if err != nil {
				return errors.Join(err, damage())
			}
			if asJSON {
				return errors.Join(printJSON(cmd.OutOrStdout(), rec), damage())
			}
			fmt.Fprintf(cmd.OutOrStdout(), "imported %s (%s); restore it with: %s restore %s --from %d\n",
				rec.Name(), human.Bytes(rec.Logical), cairnCmd(), rec.Container, rec.Seq)
			return damage()
		},
	}
	cmd.Flags().StringVar(&as, "as", "", "list the checkpoint under this container name")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the imported checkpoint's record as JSON")
	return cmd
}
