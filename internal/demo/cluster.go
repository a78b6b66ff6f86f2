package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/human"
	"github.com/cairn-hpc/cairn/internal/ringapp"
)

// clusterDemo runs cairn commands against a demo cluster of its own.
type clusterDemo struct {
	*script
	exe, data, staging string
}

func (d *clusterDemo) run(ctx context.Context, show bool, args ...string) (string, error) {
	if show {
		fmt.Fprintf(d.w, "    $ cairn %s\n", strings.Join(args, " "))
	}
	c := exec.CommandContext(ctx, d.exe, append([]string{"--data", d.data, "--staging", d.staging}, args...)...)
	out, err := c.CombinedOutput()
	if show {
		for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
			if l != "" {
				fmt.Fprintf(d.w, "      %s\n", l)
			}
		}
	}
	if err != nil {
		return string(out), fmt.Errorf("cairn %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

var demoProgressRE = regexp.MustCompile(`rank 0: (\d+)/\d+ msgs`)

func (d *clusterDemo) progress(ctx context.Context) int {
	out, _ := d.run(ctx, false, "logs", "ring/0")
	m := demoProgressRE.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

func (d *clusterDemo) placement(ctx context.Context) ([]string, error) {
	out, err := d.run(ctx, false, "ps", "--job", "ring", "--json")
	if err != nil {
		return nil, err
	}
	var st coordv1.JobStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return nil, err
	}
	return st.Placement, nil
}

func (d *clusterDemo) ckpts(ctx context.Context) ([]coordv1.Ckpt, error) {
	out, err := d.run(ctx, false, "checkpoints", "ring", "--json")
	if err != nil {
		return nil, err
	}
	var cks []coordv1.Ckpt
	return cks, json.Unmarshal([]byte(out), &cks)
}

// RunCluster runs the cluster demo: a testbed of 4 nodes (one a spare)
// and a 4-rank ring job taken through global checkpoints, a kill and a
// restart with every rank on another node, a drain, a replicated
// checkpoint and the failure of a node with its disk, after which the job
// restarts by itself; it must end with exactly the result of an
// uninterrupted run. The testbed has a data dir of its own and is removed
// afterwards unless cfg.Keep.
func RunCluster(ctx context.Context, cfg Config) (err error) {
	w, keep, messages, exe := cfg.Out, cfg.Keep, cfg.Messages, cfg.Exe
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return err
		}
	}
	dir, err := os.MkdirTemp("/var/tmp", "cairn-demo-cluster-")
	if err != nil {
		return err
	}
	d := &clusterDemo{script: &script{w: w, color: cfg.Color}, exe: exe, data: dir, staging: filepath.Join("/dev/shm", filepath.Base(dir))}
	defer func() {
		if keep {
			fmt.Fprintf(w, "\nThe cluster is still up: cairn --data %s --staging %s down\n", d.data, d.staging)
			return
		}
		if _, derr := d.run(context.WithoutCancel(ctx), false, "down"); derr != nil && err == nil {
			err = derr
		}
		os.RemoveAll(d.staging)
		os.RemoveAll(dir)
	}()

	d.say("Start a local cluster: a coordinator (embedded etcd) and 4 agents, each in its own network namespace; one node is a spare")
	if _, err := d.run(ctx, true, "up", "--nodes", "4", "--prefix", "cdemo-", "--underlay", "10.211.0.0/24", "--job-subnets", "10.236.0.0/20"); err != nil {
		return err
	}
	if _, err := d.run(ctx, true, "node", "spare", "cdemo-n4"); err != nil {
		return err
	}
	d.say("Run a 4-rank job: each rank passes checksummed 4 KiB messages to the next over TCP, as fast as it can")
	d.detail("every rank checks each message's sequence number, content and CRC: a lost, duplicated or damaged")
	d.detail("message ends the job with an error; rank 0 prints a result that depends on every message")
	if _, err := d.run(ctx, true, "run", "--job", "ring", "--ranks", "4", "--", exe, "ringapp", "-messages", strconv.Itoa(messages)); err != nil {
		return err
	}
	for d.progress(ctx) == 0 {
		time.Sleep(200 * time.Millisecond)
	}
	d.say("Take three global checkpoints while it runs (two-phase commit over every rank)")
	for i := 0; i < 3; i++ {
		if _, err := d.run(ctx, true, "checkpoint", "ring"); err != nil {
			return err
		}
		time.Sleep(time.Second)
	}
	if _, err := d.run(ctx, true, "checkpoints", "ring"); err != nil {
		return err
	}
	before, err := d.placement(ctx)
	if err != nil {
		return err
	}
	at := d.progress(ctx)
	d.say("Kill every rank (rank 0 was at message %d of %d)", at, messages)
	if _, err := d.run(ctx, true, "kill", "ring"); err != nil {
		return err
	}
	if _, err := d.run(ctx, true, "ps", "--job", "ring"); err != nil {
		return err
	}
	// Every node's ranks go to the next node.
	nodes := slices.Compact(slices.Sorted(slices.Values(before)))
	moved := make([]string, len(before))
	for r, n := range before {
		moved[r] = nodes[(slices.Index(nodes, n)+1)%len(nodes)]
	}
	d.say("Restart the whole job from its last checkpoint, every rank on another node")
	d.detail("each node fetches its ranks' images, restores them frozen with their network locked; then all resume")
	if _, err := d.run(ctx, true, "restart", "ring", "--placement", strings.Join(moved, ",")); err != nil {
		return err
	}
	after, err := d.placement(ctx)
	if err != nil {
		return err
	}
	for r := range after {
		if err := d.check(after[r] != before[r], "rank %d moved from %s to %s, keeping its address and its TCP connections", r, before[r], after[r]); err != nil {
			return err
		}
	}
	var drained string
	for _, n := range after {
		if n != after[0] {
			drained = n
			break
		}
	}
	d.say("Drain node %s for maintenance: its ranks move to other nodes, the spare first, while the job runs on", drained)
	d.detail("each move: every rank frozen with its network locked, the moving one dumped into memory and streamed")
	d.detail("to the target, restored there with its address and its TCP connections, then all resume together")
	if _, err := d.run(ctx, true, "drain", drained); err != nil {
		return err
	}
	if _, err := d.run(ctx, true, "events", "--job", "ring", "--type", "migration.*"); err != nil {
		return err
	}
	cur, err := d.placement(ctx)
	if err != nil {
		return err
	}
	if err := d.check(!slices.Contains(cur, drained), "no rank on %s any more (placement %s); the job never stopped", drained, strings.Join(cur, ",")); err != nil {
		return err
	}
	if _, err := d.run(ctx, true, "node", "undrain", drained); err != nil {
		return err
	}
	d.say("Take another checkpoint: after it is durable, each rank image is copied to another node")
	if _, err := d.run(ctx, true, "checkpoint", "ring"); err != nil {
		return err
	}
	for {
		cks, err := d.ckpts(ctx)
		if err != nil {
			return err
		}
		if cks[len(cks)-1].State == coordv1.CkptProtected {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := d.run(ctx, true, "checkpoints", "ring"); err != nil {
		return err
	}
	victim := after[0]
	d.say("Node %s fails, and its disk with it", victim)
	if _, err := d.run(ctx, true, "node", "fail", victim, "--lose-data"); err != nil {
		return err
	}
	d.detail("the coordinator sees its lease expire, and restarts the job from the replicas, the lost ranks on the spare")
	start := time.Now()
	for {
		out, err := d.run(ctx, false, "jobs", "--json")
		if err != nil {
			return err
		}
		var jobs []coordv1.Job
		if err := json.Unmarshal([]byte(out), &jobs); err != nil {
			return err
		}
		if len(jobs) == 1 && jobs[0].Restarts == 2 && jobs[0].State == coordv1.JobRunning {
			break
		}
		if time.Since(start) > 2*time.Minute {
			return fmt.Errorf("the job did not restart by itself within 2 minutes: %s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	d.detail("restarted by itself %s after the failure", human.Duration(time.Since(start)))
	if _, err := d.run(ctx, true, "ps", "--job", "ring"); err != nil {
		return err
	}
	final, err := d.placement(ctx)
	if err != nil {
		return err
	}
	if err := d.check(!slices.Contains(final, victim), "no rank on %s any more; its ranks restarted from their replicas on live nodes", victim); err != nil {
		return err
	}
	d.say("Wait for the job to finish")
	if _, err := d.run(ctx, true, "wait", "ring"); err != nil {
		return err
	}
	out, err := d.run(ctx, false, "logs", "ring/0")
	if err != nil {
		return err
	}
	m := regexp.MustCompile(`result=([0-9a-f]+)`).FindStringSubmatch(out)
	want := ringapp.Expected(4, messages, 64, 1)
	got := ""
	if m != nil {
		got = m[1]
	}
	if err := d.check(got == want, "result %s equals an uninterrupted run's (%s): no message lost or duplicated", got, want); err != nil {
		return err
	}
	d.say("Done; removing the cluster")
	return nil
}
