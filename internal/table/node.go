package table

import (
	"fmt"
	"io"
	"strconv"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/human"
	"github.com/cairn-hpc/cairn/internal/image"
)

// Status is a container's status with how it exited, or what it was
// restored from.
func Status(in *container.Info) string {
	if in.Status == container.StatusExited && in.Exit != nil {
		if in.Exit.Signal != "" {
			return fmt.Sprintf("exited (%s)", in.Exit.Signal)
		}
		return fmt.Sprintf("exited (%d)", in.Exit.Code)
	}
	if in.RestoredFrom != "" && in.Status == container.StatusRunning {
		return "running (restored " + in.RestoredFrom + ")"
	}
	return string(in.Status)
}

// Containers writes a node's containers (cairn ps).
func Containers(w io.Writer, list []*container.Info) error {
	tw := New(w)
	fmt.Fprintln(tw, "NAME\tSTATUS\tPID\tADDRESS\tCREATED\tCOMMAND")
	for _, in := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", in.Name, Status(in), pid(in.Pid), in.Addr,
			human.Ago(in.Created), truncate(Command(in.Config.Args), 40))
	}
	return tw.Flush()
}

// Container writes everything known of a container (cairn inspect).
func Container(w io.Writer, in *container.Info) error {
	tw := New(w)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	row("Name", in.Name)
	row("Status", Status(in))
	row("PID", pid(in.Pid))
	row("Command", oneLine(Command(in.Config.Args)))
	row("Address", in.Addr)
	row("Netns", in.Endpoint.Path())
	row("Veth", in.Endpoint.Veth)
	lower := in.Config.RootFS
	if lower == "" {
		lower = "/ (host)"
	}
	row("Lower layer", lower)
	row("Root", in.RootFS)
	row("Log", in.Log)
	row("Cgroup", in.CgroupsPath)
	row("Created", in.Created.Local().Format("2006-01-02 15:04:05"))
	if in.RestoredFrom != "" {
		row("Restored from", in.RestoredFrom)
	}
	return tw.Flush()
}

// Checkpoints writes a node's checkpoints (cairn checkpoints).
func Checkpoints(w io.Writer, recs []*image.Record) error {
	tw := New(w)
	fmt.Fprintln(tw, "CHECKPOINT\tCREATED\tSIZE\tNEW\tSTALL\tPINNED\tCRIU")
	for _, rec := range recs {
		pinned := ""
		if rec.Pinned {
			pinned = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", rec.Name(), human.Ago(rec.Created), human.Bytes(rec.Size()),
			human.Bytes(rec.NewBytes), human.Duration(rec.Timing.Stall), pinned, rec.CRIUVersion)
	}
	return tw.Flush()
}

// DiskUsage writes the space checkpoints take, then the store's totals
// and ratios (cairn du).
func DiskUsage(w io.Writer, du image.DiskUsage) error {
	tw := New(w)
	fmt.Fprintln(tw, "CHECKPOINT\tLOGICAL\tUNIQUE\tSTORED")
	for _, u := range du.Checkpoints {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", u.Checkpoint, human.Bytes(u.Logical), human.Bytes(u.Unique), human.Bytes(u.Stored))
	}
	fmt.Fprintf(tw, "total\t%s\t%s\t%s\n", human.Bytes(du.Logical), human.Bytes(du.Store.RawBytes), human.Bytes(du.Store.StoredBytes))
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "dedup %.2fx, compression %.2fx, %d chunks in %d packs\n",
		du.DedupRatio, du.CompressionRatio, du.Store.Chunks, du.Store.Packs)
	return err
}

// Incarnations writes a container's or a rank's incarnations.
func Incarnations(w io.Writer, incs []agentv1.Incarnation) error {
	tw := New(w)
	fmt.Fprintln(tw, "INCARNATION\tSTARTED\tRESTORED FROM\tENDED\tOUTPUT")
	for _, inc := range incs {
		n, from, ended := strconv.Itoa(inc.N), "-", "-"
		if inc.Current {
			n += " (current)"
		}
		if inc.RestoredFrom != "" {
			from = fmt.Sprintf("%s (%s of output)", inc.RestoredFrom, human.Bytes(inc.Restored))
		}
		switch {
		case inc.Checkpointed:
			ended = "checkpoint --stop " + human.Ago(inc.Ended)
		case inc.Signal != "":
			ended = fmt.Sprintf("%s %s", inc.Signal, human.Ago(inc.Ended))
		case inc.ExitCode != nil:
			ended = fmt.Sprintf("exit %d %s", *inc.ExitCode, human.Ago(inc.Ended))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n, human.Ago(inc.Started), from, ended, human.Bytes(inc.Bytes))
	}
	return tw.Flush()
}

// Checks writes what a node needs and whether it has it (cairn check).
func Checks(w io.Writer, checks []container.HostCheck) {
	for _, c := range checks {
		mark := "ok "
		switch {
		case !c.OK:
			mark = "BAD"
		case c.Limit:
			mark = "LIM"
		}
		fmt.Fprintf(w, "%s %-9s %s\n", mark, c.Name, c.Detail)
	}
}
