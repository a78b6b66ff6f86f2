package dashboard

import (
	"fmt"
	"slices"
	"strings"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/human"
)

// Kinds of timeline entries.
const (
	KindStart      = "start"      // the job started
	KindCheckpoint = "checkpoint" // a global checkpoint, with its copies
	KindMigration  = "migration"  // a rank moved
	KindFailure    = "failure"    // a node of the job lost, or the job lost
	KindRestart    = "restart"    // the job restarting from a checkpoint, restarted, or failing to
	KindCopy       = "copy"       // a copy that failed, or a damaged copy repaired
)

// Entry is one item of a job's timeline.
type Entry struct {
	Time time.Time `json:"time"`
	Kind string    `json:"kind"`
	// Seq is the number of the checkpoint or migration the entry is
	// about (0: none).
	Seq    int    `json:"seq,omitempty"`
	Title  string `json:"title"`
	State  string `json:"state,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Of a checkpoint or migration: how long the job stalled, how many
	// bytes were written or moved. Of a checkpoint: whether it is
	// protected, and the nodes holding each rank's image, by rank.
	Stall     time.Duration `json:"stall_ns,omitempty"`
	Bytes     int64         `json:"bytes,omitempty"`
	Protected bool          `json:"protected,omitempty"`
	Copies    [][]string    `json:"copies,omitempty"`
}

// Timeline builds a job's timeline, oldest first, from its checkpoints,
// its migrations and events: the job's own, and node.lost events, of
// which it keeps those of nodes that held the job's ranks or images (its
// placement, the nodes of its checkpoints and their copies, the ends of
// its migrations) from the job's creation on.
func Timeline(j coordv1.Job, cks []coordv1.Ckpt, ms []coordv1.Migration, evs []evv1.Event) []Entry {
	out := []Entry{}
	nodes := map[string]bool{}
	for _, n := range j.Placement {
		nodes[n] = true
	}
	for _, l := range j.Leftover {
		for _, n := range l {
			nodes[n] = true
		}
	}
	for _, ck := range cks {
		out = append(out, checkpointEntry(j, ck))
		for _, r := range ck.Ranks {
			nodes[r.Node] = true
			for _, n := range r.Copies {
				nodes[n] = true
			}
		}
	}
	for _, m := range ms {
		nodes[m.From], nodes[m.To] = true, true
		e := Entry{Time: m.Started, Kind: KindMigration, Seq: m.Seq, State: string(m.State), Stall: m.Stall, Bytes: m.Bytes,
			Title: fmt.Sprintf("rank %d moved %s → %s", m.Rank, m.From, m.To)}
		if m.State == coordv1.MigrationRunning {
			e.Title = fmt.Sprintf("rank %d moving %s → %s", m.Rank, m.From, m.To)
		}
		var d []string
		if m.Stall > 0 {
			d = append(d, "stall "+human.Duration(m.Stall))
		}
		if m.Bytes > 0 {
			d = append(d, human.Bytes(m.Bytes)+" moved")
		}
		if m.Reason != "" {
			d = append(d, m.Reason)
		}
		e.Detail = strings.Join(d, " · ")
		out = append(out, e)
	}
	for _, ev := range evs {
		e, ok := eventEntry(ev)
		switch {
		case !ok:
			continue
		case ev.Type == evv1.NodeLost && (!nodes[ev.Node] || ev.Time.Before(j.Created)):
			continue
		case ev.Job != "" && ev.Job != j.Name:
			continue
		}
		out = append(out, e)
	}
	slices.SortStableFunc(out, func(a, b Entry) int { return a.Time.Compare(b.Time) })
	return out
}

// checkpointEntry is a checkpoint's entry: its state, stall, size and
// copies.
func checkpointEntry(j coordv1.Job, ck coordv1.Ckpt) Entry {
	e := Entry{Time: ck.Created, Kind: KindCheckpoint, Seq: ck.Seq, State: string(ck.State), Stall: ck.Stall, Bytes: ck.Bytes,
		Protected: ck.State == coordv1.CkptProtected, Title: fmt.Sprintf("checkpoint %d", ck.Seq)}
	if ck.Periodic {
		e.Title += " (periodic)"
	}
	var d []string
	if ck.Stall > 0 {
		d = append(d, "stall "+human.Duration(ck.Stall))
	}
	if ck.Bytes > 0 {
		d = append(d, human.Bytes(ck.Bytes))
	}
	if ck.State != coordv1.CkptAborted && ck.State != coordv1.CkptPreparing && len(ck.Ranks) > 0 {
		least := -1
		for _, r := range ck.Ranks {
			e.Copies = append(e.Copies, r.Copies)
			if least < 0 || len(r.Copies) < least {
				least = len(r.Copies)
			}
		}
		want := 1 + j.Replicas
		d = append(d, fmt.Sprintf("%d of %d copies of every rank image", min(least, want), want))
		if e.Protected {
			d = append(d, "protected")
		} else {
			d = append(d, "not protected")
		}
	}
	if ck.Reason != "" {
		d = append(d, ck.Reason)
	}
	e.Detail = strings.Join(d, " · ")
	return e
}

// eventEntry is the entry of an event that has one of its own; events of
// checkpoints and migrations are in their records' entries.
func eventEntry(ev evv1.Event) (Entry, bool) {
	e := Entry{Time: ev.Time, Seq: ev.Ckpt, Detail: ev.Message}
	rank := ""
	if ev.Rank != nil {
		rank = fmt.Sprintf("rank %d ", *ev.Rank)
	}
	switch ev.Type {
	case evv1.JobStarted:
		e.Kind, e.Title = KindStart, "started"
	case evv1.JobRestarting:
		e.Kind, e.State, e.Title = KindRestart, "restarting", fmt.Sprintf("restarting from checkpoint %d", ev.Ckpt)
	case evv1.JobRestarted:
		e.Kind, e.State, e.Title = KindRestart, "done", fmt.Sprintf("restarted from checkpoint %d", ev.Ckpt)
		if ev.Duration > 0 {
			e.Detail += " in " + human.Duration(ev.Duration)
		}
	case evv1.JobRestartFailed:
		e.Kind, e.State, e.Title = KindRestart, "failed", "restart failed"
	case evv1.JobLost:
		e.Kind, e.State, e.Title = KindFailure, "lost", "job lost"
	case evv1.JobFailed:
		e.Kind, e.State, e.Title = KindFailure, "failed", "job failed"
	case evv1.JobExited:
		e.Kind, e.State, e.Title = KindStart, "done", "job exited"
	case evv1.JobStopped:
		e.Kind, e.State, e.Title = KindStart, "stopped", fmt.Sprintf("job stopped at checkpoint %d", ev.Ckpt)
	case evv1.NodeLost:
		e.Kind, e.State, e.Title = KindFailure, "dead", fmt.Sprintf("node %s lost", ev.Node)
	case evv1.ReplicaFailed:
		e.Kind, e.State = KindCopy, "failed"
		e.Title = fmt.Sprintf("copy of %sof checkpoint %d to %s failed", rank, ev.Ckpt, ev.Node)
	case evv1.ReplicaRepaired:
		e.Kind, e.State = KindCopy, "repaired"
		e.Title = fmt.Sprintf("copy of %sof checkpoint %d on %s repaired from %s", rank, ev.Ckpt, ev.Node, ev.Peer)
	default:
		return Entry{}, false
	}
	return e, true
}
