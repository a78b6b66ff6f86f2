package table

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/human"
)

// Jobs writes the cluster's jobs (cairn jobs).
func Jobs(w io.Writer, jobs []coordv1.Job) error {
	tw := New(w)
	fmt.Fprintln(tw, "JOB\tRANKS\tSTATE\tNODES\tLAST CKPT\tRESTARTS\tCREATED\tCOMMAND")
	for _, j := range jobs {
		last := "-"
		if j.LastCkpt > 0 {
			last = strconv.Itoa(j.LastCkpt)
		}
		state := string(j.State)
		if j.Reason != "" && (j.State == coordv1.JobFailed || j.State == coordv1.JobLost) {
			state += " (" + truncate(j.Reason, 40) + ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\n", j.Name, j.Ranks, state, nodeSet(j.Placement),
			last, j.Restarts, human.Ago(j.Created), truncate(strings.Join(j.Args, " "), 30))
	}
	return tw.Flush()
}

// Placement writes where a job's ranks are, one line each.
func Placement(w io.Writer, j coordv1.Job) {
	for r, n := range j.Placement {
		fmt.Fprintf(w, "  rank %d  %-15s on %s\n", r, j.Addrs[r], n)
	}
}

// Nodes writes the cluster's nodes (cairn nodes).
func Nodes(w io.Writer, nodes []coordv1.Node) error {
	tw := New(w)
	fmt.Fprintln(tw, "NODE\tSTATE\tRANKS\tAGENT\tUNDERLAY\tJOINED\tHEALTH")
	for _, n := range nodes {
		state := "dead"
		if n.Alive {
			state = "alive"
		}
		if n.Spare {
			state += " (spare)"
		}
		if n.Drained {
			state += " (drained)"
		}
		health := "ok"
		if len(n.Health) > 0 {
			health = truncate(strings.Join(n.Health, "; "), 40)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", n.Name, state, n.Ranks, n.Addr, n.Underlay, human.Ago(n.Joined), health)
	}
	return tw.Flush()
}

// Ranks writes a job's ranks (cairn ps --job).
func Ranks(w io.Writer, st coordv1.JobStatus) error {
	tw := New(w)
	fmt.Fprintln(tw, "RANK\tNODE\tADDRESS\tSTATUS\tPID")
	for _, r := range st.RankStates {
		status := string(r.Status)
		if r.ExitCode != nil && (r.Status == agentv1.StatusExited || r.Status == agentv1.StatusStopped) {
			status = fmt.Sprintf("exited (%d)", *r.ExitCode)
		}
		if r.Error != "" {
			status += " (" + r.Error + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", r.Rank, r.Node, r.Addr, status, pid(r.Pid))
	}
	return tw.Flush()
}

// Ckpts writes a job's global checkpoints (cairn checkpoints JOB).
func Ckpts(w io.Writer, cks []coordv1.Ckpt) error {
	tw := New(w)
	fmt.Fprintln(tw, "CHECKPOINT\tSTATE\tCREATED\tRANKS\tSIZE\tSTALL\tCOORD\tCOPIES\tNODES\tREASON")
	for _, ck := range cks {
		var nodes []string
		copies := -1
		for _, r := range ck.Ranks {
			nodes = append(nodes, r.Node)
			if copies < 0 || len(r.Copies) < copies {
				copies = len(r.Copies)
			}
		}
		state, reason := string(ck.State), ck.Reason
		if copies == 0 && ck.Flushed != nil && reason == "" {
			reason = "rank images on no node: in the durable tier"
		}
		if len(ck.Unavailable) > 0 {
			// Not restorable now: say so where the eye looks first.
			state = "unavailable"
			reason = fmt.Sprintf("%s, but no live copy of rank %s", ck.State, intList(ck.Unavailable))
		}
		fmt.Fprintf(tw, "%s:%d\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\n", ck.Job, ck.Seq, state, human.Ago(ck.Created), len(ck.Ranks),
			human.Bytes(ck.Bytes), human.Duration(ck.Stall), human.Duration(ck.Coord), max(copies, 0), nodeSet(nodes), truncate(reason, 50))
	}
	return tw.Flush()
}

// intList is a list of numbers, comma-separated.
func intList(ns []int) string {
	var b strings.Builder
	for i, n := range ns {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, n)
	}
	return b.String()
}

// Migrations writes a job's rank migrations (cairn migrations).
func Migrations(w io.Writer, ms []coordv1.Migration) error {
	tw := New(w)
	fmt.Fprintln(tw, "SEQ\tRANK\tFROM\tTO\tSTATE\tSTALL\tBYTES\tSTARTED\tREASON")
	for _, m := range ms {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Seq, m.Rank, m.From, m.To, m.State,
			m.Stall.Round(time.Millisecond), human.Bytes(m.Bytes), human.Ago(m.Started), truncate(m.Reason, 40))
	}
	return tw.Flush()
}

// Migration writes one migration: where the rank went and how long each
// phase stalled the job, then why it failed, if it did.
func Migration(w io.Writer, m coordv1.Migration) {
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	moved := human.Bytes(m.Bytes)
	if m.PostCopy {
		moved += " (post-copy: its memory after)"
	}
	fmt.Fprintf(w, "%s/%d: %s -> %s %s (job stalled %s: dump %s, move %s of %s, restore %s, resume %s)\n",
		m.Job, m.Rank, m.From, m.To, m.State, ms(m.Stall), ms(m.Dump), ms(m.Move), moved, ms(m.Restore), ms(m.Resume))
	if m.Reason != "" {
		fmt.Fprintf(w, "  %s\n", m.Reason)
	}
}

// Event is the line of an event in cairn events: number, time, type, then
// what it concerns.
func Event(e evv1.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%6d  %s  %-20s", e.Seq, e.Time.Local().Format("15:04:05.000"), e.Type)
	kv := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&b, " %s=%s", k, v)
		}
	}
	kv("job", e.Job)
	if e.Rank != nil {
		kv("rank", strconv.Itoa(*e.Rank))
	}
	if e.Ckpt > 0 {
		kv("ckpt", strconv.Itoa(e.Ckpt))
	}
	kv("node", e.Node)
	kv("peer", e.Peer)
	switch {
	case e.Duration > 0 && e.Type == evv1.JobInterval:
		kv("every", e.Duration.Round(time.Millisecond).String())
	case e.Duration > 0:
		kv("took", e.Duration.Round(time.Millisecond).String())
	}
	if e.Bytes > 0 {
		kv("bytes", human.Bytes(e.Bytes))
	}
	if e.Message != "" {
		fmt.Fprintf(&b, "  %s", e.Message)
	}
	return Printable(b.String())
}

// Coordinators writes the cluster's coordinators (cairn coordinators):
// ROLE is leader, standby, or down for one the caller knows of that does
// not run.
func Coordinators(w io.Writer, list []coordv1.Coordinator) error {
	tw := New(w)
	fmt.Fprintln(tw, "NAME\tROLE\tADDRESS\tHOST\tPID\tTERM\tSINCE")
	for _, c := range list {
		role, term, since := "standby", "-", human.Ago(c.Started)
		switch {
		case c.Leader:
			role, term, since = "leader", c.Term, human.Ago(c.Since)
		case c.Started.IsZero():
			role, since = "down", "-"
		}
		pid := "-"
		if c.PID > 0 {
			pid = fmt.Sprint(c.PID)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Name, role, c.Addr, c.Host, pid, term, since)
	}
	return tw.Flush()
}
