package testutil

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
)

// Output says how a workload's output shows that its processes started
// and how far they got, so that a restored incarnation can be told from
// one started afresh, which would end with the same result.
type Output struct {
	// Start matches a line the processes print when they start (and never
	// again while they run).
	Start *regexp.Regexp
	// Progress matches a line whose first submatch is a count that only
	// grows while the processes run.
	Progress *regexp.Regexp
	// Rank0 says that only rank 0's output shows them: an MPI job's
	// launcher, in rank 0, gathers every process's output.
	Rank0 bool
}

// RingOutput is the output of the ring job (`cairn ringapp`,
// internal/ringapp): a rank listens and connects once, then counts its
// messages.
var RingOutput = Output{
	Start:    regexp.MustCompile(`^rank \d+/\d+: (?:listening on|ring connected)`),
	Progress: regexp.MustCompile(`^rank \d+: (?:done )?(\d+)(?:/\d+)? msgs$`),
}

// errNoProgress is restoredOutput's answer for an incarnation that has
// not printed its progress yet.
var errNoProgress = errors.New("no progress printed since the restore yet")

// restoredOutput checks the output of an incarnation restored from a
// checkpoint whose kept output is its first restored bytes: the kept part
// shows the processes' start, what they printed since shows no second
// start, and its progress goes on from the checkpoint's, never back.
func restoredOutput(log string, restored int64, out Output) error {
	if restored <= 0 || restored > int64(len(log)) {
		return fmt.Errorf("the incarnation started with %d bytes of its checkpoint's output, its log has %d", restored, len(log))
	}
	var keptStarts, ownStarts []string
	atCkpt, last, own := 0, 0, 0
	off := int64(0)
	for line := range strings.Lines(log) {
		kept := off < restored // a line is the part's it starts in
		off += int64(len(line))
		line = strings.TrimSuffix(line, "\n")
		if out.Start != nil && out.Start.MatchString(line) {
			if kept {
				keptStarts = append(keptStarts, line)
			} else {
				ownStarts = append(ownStarts, line)
			}
		}
		m := out.Progress.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n, err := strconv.Atoi(m[1])
		if err != nil {
			return fmt.Errorf("progress line %q: %v", line, err)
		}
		if !kept && n < atCkpt {
			return fmt.Errorf("progress %d after the restore (%q), below the checkpoint's %d: the count started again", n, line, atCkpt)
		}
		if n < last {
			return fmt.Errorf("progress went back from %d to %d (%q)", last, n, line)
		}
		last = n
		if kept {
			atCkpt = n
		} else {
			own++
		}
	}
	switch {
	case out.Start != nil && len(keptStarts) == 0:
		return fmt.Errorf("the output kept with the checkpoint (%d bytes) never shows the processes starting", restored)
	case len(ownStarts) > 0:
		return fmt.Errorf("started afresh: printed %q after the restore", ownStarts)
	case own == 0:
		return errNoProgress
	}
	return nil
}

// CheckRestoredLog checks the output of a container's current incarnation
// inc (log) restored from checkpoint from (NAME:SEQ), rather than started
// afresh: inc was restored from that checkpoint and started with its
// output, which shows the processes' start; what they printed since shows
// no second start, and counts on from the checkpoint's progress.
func CheckRestoredLog(t testing.TB, what, log string, inc agentv1.Incarnation, from string, out Output) {
	t.Helper()
	if !inc.Current || inc.RestoredFrom != from {
		t.Fatalf("%s: current incarnation %+v, want one restored from %s", what, inc, from)
	}
	if err := restoredOutput(log, inc.Restored, out); err != nil {
		t.Fatalf("%s, restored from %s: %v\n%s", what, from, err, tail(log))
	}
}

func tail(log string) string {
	if len(log) > 3000 {
		return "..." + log[len(log)-3000:]
	}
	return log
}

// Incarnations is `cairn logs JOB/RANK --incarnations --json`.
func (c *Cluster) Incarnations(job string, rank int) ([]agentv1.Incarnation, error) {
	out, err := c.Run("logs", fmt.Sprintf("%s/%d", job, rank), "--incarnations", "--json")
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, out)
	}
	var incs []agentv1.Incarnation
	if err := json.Unmarshal([]byte(out), &incs); err != nil || len(incs) == 0 {
		return nil, fmt.Errorf("incarnations %q: %v", out, err)
	}
	return incs, nil
}

// CheckRestored checks that rank of job was restored from its image of
// checkpoint (or migration) seq and went on from there rather than
// starting afresh: its current incarnation was restored from JOB.RANK:SEQ
// and, if the rank prints out's lines, its output is as CheckRestoredLog
// wants. It waits for the rank to print its progress after the restore.
func (c *Cluster) CheckRestored(job string, rank, seq int, out Output) {
	c.t.Helper()
	ref := fmt.Sprintf("%s/%d", job, rank)
	from := fmt.Sprintf("%s.%d:%d", job, rank, seq)
	WaitUntil(c.t, 2*time.Minute, func() (bool, string) {
		incs, err := c.Incarnations(job, rank)
		if err != nil {
			return false, fmt.Sprintf("%s: %v", ref, err) // a coordinator starting, say
		}
		inc := incs[len(incs)-1]
		if !inc.Current || inc.RestoredFrom != from {
			c.t.Fatalf("rank %s's current incarnation is %+v, want one restored from %s", ref, inc, from)
		}
		if out.Rank0 && rank != 0 {
			return true, ""
		}
		log, err := c.Run("logs", ref)
		if err != nil {
			return false, fmt.Sprintf("cairn logs %s: %v: %s", ref, err, log)
		}
		err = restoredOutput(log, inc.Restored, out)
		if errors.Is(err, errNoProgress) {
			return false, fmt.Sprintf("rank %s, restored from %s: %v\n%s", ref, from, err, tail(log))
		}
		if err != nil {
			c.t.Fatalf("rank %s, restored from %s: %v\n%s", ref, from, err, tail(log))
		}
		return true, ""
	})
}

// CheckRestarted checks that job was last restarted from checkpoint seq,
// as its coordinator records it (restored_from), and that every rank was
// restored from that checkpoint, not started afresh (CheckRestored).
func (c *Cluster) CheckRestarted(job string, seq int, out Output) {
	c.t.Helper()
	j := c.Job(job)
	if j.RestoredFrom != seq || j.Restarts == 0 {
		c.t.Fatalf("job %s restarted %d times, last from checkpoint %d; want it restored from checkpoint %d", job, j.Restarts, j.RestoredFrom, seq)
	}
	for r := range j.Placement {
		c.CheckRestored(job, r, seq, out)
	}
}

// CheckNeverRestored checks that rank of job still runs as it started:
// its current incarnation is its first, from no checkpoint.
func (c *Cluster) CheckNeverRestored(job string, rank int) {
	c.t.Helper()
	incs, err := c.Incarnations(job, rank)
	if err != nil {
		c.t.Fatal(err)
	}
	if inc := incs[len(incs)-1]; inc.N != 1 || inc.RestoredFrom != "" {
		c.t.Fatalf("rank %s/%d's current incarnation is %+v, want its first run", job, rank, inc)
	}
}
