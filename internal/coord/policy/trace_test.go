package policy_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/coord/policy"
	"github.com/cairn-hpc/cairn/internal/tracetest"
)

// TestTraces runs the scripts in testdata/*.txt (see package tracetest).
// Commands that set the snapshot print nothing:
//
//	job NAME nodes=A,B [stopped] [no-restart] [health=migrate|checkpoint] [every=DUR] [auto] [needs-interval]
//	drop NAME                  the job is gone
//	live A,B                   the live nodes
//	at DUR                     the time, from the start of the script
//
// Events print the actions Step returns:
//
//	tick | node-lost [NODE] | node-unwell NODE | started JOB
//	round-ended JOB:SEQ [durable] [periodic] [damaged="why"] | checkpoint-ended JOB
//	migration-ended JOB/RANK [damaged="why"]
//	restart-ended JOB cause=lost|damaged|left|asked|retry attempt=N [err="why"]
//	ranks-ended JOB | interval-reviewed JOB | left JOB [seq=N]
//	replicate-ended JOB:SEQ [incomplete] | rank-ended-by-node JOB reason="why"
func TestTraces(t *testing.T) {
	tracetest.Run(t, "testdata/*.txt", func(t *testing.T) func(string) ([]string, error) {
		tr := &tracer{m: policy.New(policy.Config{RetryAfter: 4 * time.Second}), live: map[string]bool{}}
		return tr.run
	})
}

type tracer struct {
	m    *policy.Machine
	now  time.Duration
	jobs []policy.Job
	live map[string]bool
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (tr *tracer) run(line string) ([]string, error) {
	cmd, rest, _ := strings.Cut(line, " ")
	rest, quoted, err := cutQuoted(rest)
	if err != nil {
		return nil, err
	}
	f := strings.Fields(rest)
	kv := map[string]string{}
	for _, w := range f {
		k, v, _ := strings.Cut(w, "=")
		kv[k] = v
	}
	arg := ""
	if len(f) > 0 {
		arg = f[0]
	}
	var ev policy.Event
	switch cmd {
	case "job":
		j := policy.Job{Name: arg, Running: true, MayRestart: true, Placement: list(kv["nodes"])}
		_, stopped := kv["stopped"]
		_, noRestart := kv["no-restart"]
		_, j.Auto = kv["auto"]
		_, j.NeedsInterval = kv["needs-interval"]
		j.Running, j.MayRestart = !stopped, !noRestart
		switch kv["health"] {
		case "migrate":
			j.OnHealth = policy.HealthMigrate
		case "checkpoint":
			j.OnHealth = policy.HealthCheckpoint
		}
		if e, ok := kv["every"]; ok {
			if j.Every, err = time.ParseDuration(e); err != nil {
				return nil, err
			}
		}
		if k, ok := kv["keep"]; ok {
			if j.Keep, err = strconv.Atoi(k); err != nil {
				return nil, err
			}
		}
		if k, ok := kv["flush-every"]; ok {
			if j.FlushEvery, err = strconv.Atoi(k); err != nil {
				return nil, err
			}
		}
		tr.drop(arg)
		tr.jobs = append(tr.jobs, j)
		return nil, nil
	case "drop":
		tr.drop(arg)
		return nil, nil
	case "live":
		tr.live = map[string]bool{}
		for _, n := range list(arg) {
			tr.live[n] = true
		}
		return nil, nil
	case "at":
		tr.now, err = time.ParseDuration(arg)
		return nil, err
	case "tick":
		ev = policy.Tick{}
	case "node-lost":
		ev = policy.NodeLost{Node: arg}
	case "node-unwell":
		ev = policy.NodeUnwell{Node: arg}
	case "started":
		ev = policy.Started{Job: arg}
	case "checkpoint-ended":
		ev = policy.CheckpointEnded{Job: arg}
	case "round-ended":
		job, seq, _ := strings.Cut(arg, ":")
		e := policy.RoundEnded{Job: job, Damaged: quoted}
		e.Seq, _ = strconv.Atoi(seq)
		_, e.Durable = kv["durable"]
		_, e.Periodic = kv["periodic"]
		ev = e
	case "migration-ended":
		job, rank, _ := strings.Cut(arg, "/")
		e := policy.MigrationEnded{Job: job, Damaged: quoted}
		e.Rank, _ = strconv.Atoi(rank)
		ev = e
	case "restart-ended":
		e := policy.RestartEnded{Job: arg, Err: quoted}
		e.Attempt, _ = strconv.Atoi(kv["attempt"])
		switch kv["cause"] {
		case "lost":
			e.Cause = policy.CauseLost
		case "damaged":
			e.Cause = policy.CauseDamaged
		case "left":
			e.Cause = policy.CauseLeft
		case "asked":
			e.Cause = policy.CauseAsked
		case "retry":
			e.Cause = policy.CauseRetry
		default:
			return nil, fmt.Errorf("cause %q", kv["cause"])
		}
		ev = e
	case "ranks-ended":
		ev = policy.RanksEnded{Job: arg}
	case "rank-ended-by-node":
		ev = policy.RankEndedByNode{Job: arg, Reason: quoted}
	case "replicate-ended":
		job, seq, _ := strings.Cut(arg, ":")
		e := policy.ReplicateEnded{Job: job}
		e.Seq, _ = strconv.Atoi(seq)
		_, e.Incomplete = kv["incomplete"]
		ev = e
	case "interval-reviewed":
		ev = policy.IntervalReviewed{Job: arg}
	case "left":
		e := policy.Left{Job: arg}
		e.Seq, _ = strconv.Atoi(kv["seq"])
		ev = e
	default:
		return nil, fmt.Errorf("unknown command %q", cmd)
	}
	var out []string
	for _, a := range tr.m.Step(policy.Snapshot{Now: epoch.Add(tr.now), Jobs: tr.jobs, Live: tr.live}, ev) {
		out = append(out, a.String())
	}
	return out, nil
}

func (tr *tracer) drop(name string) {
	for i, j := range tr.jobs {
		if j.Name == name {
			tr.jobs = append(tr.jobs[:i], tr.jobs[i+1:]...)
			return
		}
	}
}

// cutQuoted takes a trailing damaged="..." or err="..." off s.
func cutQuoted(s string) (string, string, error) {
	for _, k := range []string{" damaged=", " err=", " reason="} {
		if i := strings.Index(s, k); i >= 0 {
			q, err := strconv.Unquote(strings.TrimSpace(s[i+len(k):]))
			return s[:i], q, err
		}
	}
	return s, "", nil
}

func list(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
