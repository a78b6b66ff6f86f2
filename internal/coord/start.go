package coord

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	evv1 "github.com/cairn-hpc/cairn/api/events/v1"
	"github.com/cairn-hpc/cairn/internal/coord/machine"
	"github.com/cairn-hpc/cairn/internal/coord/policy"
	"github.com/cairn-hpc/cairn/internal/launch"
)

// startJob runs the start of j, which the catalog holds as starting, to
// its end (machine.JobStart); recover says that an earlier coordinator
// died during it.
func (jr *jobRuns) startJob(ctx context.Context, j *coordv1.Job, recover bool) (machine.Done, error) {
	c := jr.c
	m, err := machine.NewStart(machine.StartConfig{Job: j.Name, Placement: j.Placement, Recover: recover})
	if err != nil {
		return machine.Done{}, err
	}
	subnet, err := netip.ParsePrefix(j.Subnet)
	if err != nil {
		return machine.Done{}, err
	}
	launchEnv, err := launchEnv(j.RunJob)
	if err != nil {
		return machine.Done{}, err
	}
	x, err := jr.newJobRun(ctx, j, c.log.With("job", j.Name))
	if err != nil {
		return machine.Done{}, err
	}
	req := j.RunJob
	common := []string{"CAIRN_JOB=" + j.Name, "CAIRN_SIZE=" + strconv.Itoa(req.Ranks), launch.EnvSubnet + "=" + subnet.String(),
		"CAIRN_MODE=" + jobMode(j)}
	// Every rank's address, unless the list is too long for one
	// environment string (Linux takes 128 KiB; a job of some 8,000 ranks):
	// rank r's address is the subnet's third plus r (launch.Peers).
	if peers := "CAIRN_PEERS=" + strings.Join(j.Addrs, ","); len(peers) <= MaxPeersEnv {
		common = append(common, peers)
	}
	x.run = func(r int) agentv1.RankRun {
		own := append(append(slices.Clone(common), "CAIRN_RANK="+strconv.Itoa(r)), launchEnv...)
		env := append(own, userEnv(req.Env, own)...)
		return agentv1.RankRun{
			Rank: agentv1.Rank{Job: j.Name, Rank: r}, Net: x.ownNet(j.Placement[r]),
			Addr: j.Addrs[r], Args: req.Args, Env: env, RootFS: req.RootFS, MPI: req.MPI,
			Cwd: req.Cwd, Volumes: req.Volumes, CPUs: req.CPUs, Memory: req.Memory, PidsLimit: req.PidsLimit,
		}
	}
	x.persist = func(ctx context.Context, p machine.Persist) error {
		switch p.Phase {
		case machine.PhaseRunning:
			return jr.markStarted(ctx, j)
		case machine.PhaseRemoved:
			return c.cat.Delete(ctx, jobKey(j.Name))
		}
		return fmt.Errorf("job start: no phase %s", p.Phase)
	}
	return x.drive(ctx, m)
}

// markStarted records a job whose every rank runs as running.
func (jr *jobRuns) markStarted(ctx context.Context, j *coordv1.Job) error {
	c := jr.c
	if _, err := c.rec.updateJob(ctx, j.Name, func(j *coordv1.Job) error { j.State = coordv1.JobRunning; return nil }); err != nil {
		return err
	}
	c.sup.observe(policy.Started{Job: j.Name})
	c.log.Info("job started", "job", j.Name, "ranks", j.Ranks, "placement", j.Placement)
	c.publish(evv1.Event{Type: evv1.JobStarted, Job: j.Name, Message: fmt.Sprintf("%d ranks on %s", j.Ranks, strings.Join(j.Placement, ","))})
	return nil
}

// recoverStarts finishes the job starts an earlier coordinator left: a job
// still starting whose every rank runs is recorded running; any other has
// what it started removed and is started again, as asked (it has no
// checkpoint to lose). Its nodes may not have joined this coordinator
// yet: five attempts, a node lease apart; then the job is failed.
func (jr *jobRuns) recoverStarts(ctx context.Context) {
	c := jr.c
	jobs, err := c.Jobs(ctx)
	if err != nil {
		c.log.Warn("recover job starts", "err", err)
		return
	}
	for _, j := range jobs {
		if j.State != coordv1.JobStarting {
			continue
		}
		c.log.Info("finishing a job start an earlier coordinator left", "job", j.Name)
		err := retry(ctx, c.opts.NodeTTL, func(attempt int, err error) {
			c.log.Warn("finishing a job start failed", "job", j.Name, "attempt", attempt, "err", err)
		}, func() error {
			defer c.locks.lock(j.Name)()
			done, err := jr.startJob(ctx, &j, true)
			if err == nil {
				err = doneErr(done)
			}
			return err
		})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			unlock := c.locks.lock(j.Name)
			c.life.endJob(ctx, j.Name, coordv1.JobFailed, "its start was cut short and could not be finished: "+err.Error())
			unlock()
		}
	}
}

// launchEnv returns the environment an MPI job's ranks get besides every
// job's: the MPI implementation, and a fresh secret that authenticates the
// ranks to each other's launch daemons.
func launchEnv(req coordv1.RunJob) ([]string, error) {
	if req.MPI == "" {
		return nil, nil
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	return []string{
		launch.EnvMPI + "=" + req.MPI,
		launch.EnvSecret + "=" + hex.EncodeToString(secret),
	}, nil
}

// MaxPeersEnv is the longest CAIRN_PEERS a job's ranks are given.
const MaxPeersEnv = 64 << 10

// userEnv is env (a job's -e and --export) without the variables cairn
// sets itself in own: a rank's identity (CAIRN_JOB, CAIRN_RANK, ...) is
// cairn's to give, not the submitter's.
func userEnv(env, own []string) []string {
	set := map[string]bool{}
	for _, kv := range own {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); !set[k] {
			out = append(out, kv)
		}
	}
	return out
}

// retry runs fn until it succeeds: five attempts, every apart (the nodes
// of a new coordinator join it one by one). It tells failed of each
// failure and returns the last error, or ctx's.
func retry(ctx context.Context, every time.Duration, failed func(attempt int, err error), fn func() error) error {
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil {
			return nil
		}
		failed(attempt, err)
		if attempt == 5 {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}
