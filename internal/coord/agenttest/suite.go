package agenttest

import (
	"testing"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
)

// Run runs every case of the suite against env, each as a subtest of t
// on two fresh nodes.
func Run(t *testing.T, env Env) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if env.Parallel {
				t.Parallel()
			}
			c.run(newFixture(t, env))
		})
	}
}

// Names returns the names of the suite's cases, as Run names its
// subtests.
func Names() []string {
	out := make([]string, len(cases))
	for i, c := range cases {
		out[i] = c.name
	}
	return out
}

// cases is the agent's contract, one case a part of it. Node 0 holds the
// ranks unless a case says otherwise.
var cases = []struct {
	name string
	run  func(f *fixture)
}{
	{"RankRun", rankRun},
	{"Kill", kill},
	{"StallResume", stallResume},
	{"StallHoldEnds", stallHoldEnds},
	{"PrepareCommit", prepareCommit},
	{"PrepareCommitStop", prepareCommitStop},
	{"PrepareAbort", prepareAbort},
	{"AbortBeforePrepare", abortBeforePrepare},
	{"PrepareHoldEnds", prepareHoldEnds},
	{"PreparedImageExpires", preparedImageExpires},
	{"Restore", restore},
	{"Remove", remove},
	{"RemoveEndsHolds", removeEndsHolds},
	{"MigrateOut", migrateOut},
	{"MigrateIn", migrateIn},
	{"MigrateInHoldEnds", migrateInHoldEnds},
	{"JobNet", jobNet},
	{"Fetch", fetch},
	{"DropImages", dropImages},
	{"Tier", tierFlushFetch},
}

// rankRun: a rank runs, with its address, and Get says so; a second start
// of it is refused, for its address or, at another, for its name, and
// leaves it running.
func rankRun(f *fixture) {
	f.run(0, 0)
	ct, err := f.get(0, 0)
	mustOK(f.t, err, "get")
	if ct.Name != name(0) || ct.Status != agentv1.StatusRunning || ct.Addr != addr(0) || ct.ExitCode != nil || ct.RestoredFrom != "" {
		f.t.Errorf("get answered %+v, want %s running at %s", ct, name(0), addr(0))
	}
	// The rank's address is taken on the node (its network namespace)
	// before its container is looked for.
	_, err = f.rankRun(0, 0)
	wantCode(f.t, err, agentv1.CodeInternal, "run %s again", name(0))
	f.want(0, 0, running)
	_, err = f.rankRunAt(0, 0, addr(5))
	wantCode(f.t, err, agentv1.CodeExists, "run %s again at another address", name(0))
	f.want(0, 0, running)
	_, err = f.get(0, 9)
	wantCode(f.t, err, agentv1.CodeNotFound, "get %s", name(9))
	// Another rank starts beside it.
	f.run(0, 1)
	f.want(0, 0, running)
}

// kill: a killed rank ends, exited by SIGKILL; it cannot be killed or
// prepared again; a stalled one keeps its network locked until the
// resume. A signal must be one.
func kill(f *fixture) {
	f.run(0, 0)
	wantCode(f.t, f.kill(0, 0, 0), agentv1.CodeBadRequest, "kill with signal 0")
	wantCode(f.t, f.kill(0, 9, 9), agentv1.CodeNotFound, "kill %s", name(9))
	f.want(0, 0, running)
	wantOK(f.t, f.kill(0, 0, 9), "kill")
	ct := f.await(0, 0, exited, 0)
	if ct.ExitCode == nil || *ct.ExitCode != 128+9 {
		f.t.Errorf("killed %s exit code %v, want %d", name(0), ct.ExitCode, 128+9)
	}
	wantCode(f.t, f.kill(0, 0, 9), agentv1.CodeNotRunning, "kill again")
	_, err := f.tryPrepare(0, 0, 1, long)
	wantCode(f.t, err, agentv1.CodeNotRunning, "prepare an exited rank")
	f.want(0, 0, exited)

	// A kill leaves a stalled rank's network locked, until the resume.
	f.run(0, 1)
	wantOK(f.t, f.stall(0, long, 1), "stall")
	wantOK(f.t, f.kill(0, 1, 9), "kill a stalled rank")
	f.await(0, 1, state{Status: agentv1.StatusExited, Locked: true}, 0)
	wantOK(f.t, f.resume(0, 1), "resume")
	f.want(0, 1, exited)
}

// stallResume: a stall locks and freezes ranks until RankResume, all or
// none; a stall and a resume sent again change nothing; a resume resumes
// every rank it finds; a rank that has exited stays so.
func stallResume(f *fixture) {
	f.run(0, 0)
	f.run(0, 1)
	wantOK(f.t, f.stall(0, long, 0, 1), "stall")
	f.want(0, 0, frozen)
	f.want(0, 1, frozen)
	wantOK(f.t, f.stall(0, long, 0), "stall again")
	f.want(0, 0, frozen)
	wantOK(f.t, f.resume(0, 0, 1), "resume")
	f.want(0, 0, running)
	f.want(0, 1, running)
	wantOK(f.t, f.resume(0, 0), "resume again")
	f.want(0, 0, running)

	wantCode(f.t, f.stall(0, long, 0, 9), agentv1.CodeNotFound, "stall with %s", name(9))
	f.want(0, 0, running)
	wantOK(f.t, f.stall(0, long, 1), "stall")
	wantCode(f.t, f.resume(0, 9, 1), agentv1.CodeNotFound, "resume with %s", name(9))
	f.want(0, 1, running)

	// A stall of a rank that has exited freezes what is left of it (it
	// reads paused) and locks its network; the resume cannot bring it
	// back: it has exited again, as it ended.
	wantOK(f.t, f.kill(0, 1, 9), "kill")
	f.await(0, 1, exited, 0)
	wantOK(f.t, f.stall(0, long, 1), "stall an exited rank")
	f.want(0, 1, frozen)
	wantOK(f.t, f.resume(0, 1), "resume an exited rank")
	ct := f.want(0, 1, exited)
	if ct.ExitCode == nil || *ct.ExitCode != 128+9 {
		f.t.Errorf("resumed exited %s has exit code %v, want %d", name(1), ct.ExitCode, 128+9)
	}
}

// stallHoldEnds: a stalled rank that no resume reaches within its hold
// resumes by itself; a resume that comes later still succeeds.
func stallHoldEnds(f *fixture) {
	f.run(0, 0)
	wantOK(f.t, f.stall(0, f.env.Hold, 0), "stall")
	f.want(0, 0, frozen)
	f.await(0, 0, running, f.env.Hold)
	wantOK(f.t, f.resume(0, 0), "resume after the hold")
	f.want(0, 0, running)
}

// prepareCommit: a prepare freezes the rank and locks its network until
// the commit, which thaws it and stores the image; a second prepare is
// refused; a commit sent again, or after an abort, answers the stored
// checkpoint; a commit of nothing prepared is refused.
func prepareCommit(f *fixture) {
	f.run(0, 0)
	f.prepare(0, 0, 1, long)
	_, err := f.tryPrepare(0, 0, 1, long)
	wantCode(f.t, err, agentv1.CodeExists, "prepare again")
	f.want(0, 0, frozen)
	first := f.commit(0, 0, 1)
	f.want(0, 0, running)
	again := f.commit(0, 0, 1)
	if again.Size != first.Size {
		f.t.Errorf("commit again answered %d bytes, the commit %d", again.Size, first.Size)
	}
	wantOK(f.t, f.abort(0, 0, 1), "abort a committed checkpoint")
	f.commit(0, 0, 1)
	f.want(0, 0, running)
	_, err = f.tryCommit(0, 0, 2)
	wantCode(f.t, err, agentv1.CodeNoSuchRound, "commit of nothing prepared")
	_, err = f.tryPrepare(0, 9, 1, long)
	wantCode(f.t, err, agentv1.CodeNotFound, "prepare %s", name(9))
	f.want(0, 0, running)
}

// prepareCommitStop: a commit with Stop ends the frozen rank instead of
// thawing it (checkpointed, its network still locked) and stores the
// image; sent again, it answers the stored checkpoint; a commit with Stop
// of nothing prepared is refused but ends the rank all the same (its
// prepare was lost: the job stops there); a stopped rank restores from
// the checkpoint it stopped at.
func prepareCommitStop(f *fixture) {
	f.run(0, 0)
	f.run(0, 1)
	f.prepare(0, 0, 1, long)
	first := f.commitStop(0, 0, 1)
	f.want(0, 0, stopped)
	again := f.commitStop(0, 0, 1)
	if again.Size != first.Size {
		f.t.Errorf("commit and stop again answered %d bytes, the commit %d", again.Size, first.Size)
	}
	f.want(0, 0, stopped)
	_, err := f.tryCommitStop(0, 1, 1)
	wantCode(f.t, err, agentv1.CodeNoSuchRound, "commit and stop of nothing prepared")
	got, _ := f.state(0, 1)
	if got.Status != agentv1.StatusCheckpointed {
		f.t.Errorf("%s is %s after a commit with stop of nothing prepared, want it ended (%s)", name(1), got, agentv1.StatusCheckpointed)
	}
	f.restored(0, 0, 1)
	wantOK(f.t, f.resume(0, 0), "resume")
	f.want(0, 0, running)
}

// prepareAbort: an abort thaws the rank and unlocks its network, and
// drops the image: a commit after it is refused; an abort sent again
// does nothing.
func prepareAbort(f *fixture) {
	f.run(0, 0)
	f.prepare(0, 0, 1, long)
	wantOK(f.t, f.abort(0, 0, 1), "abort")
	f.want(0, 0, running)
	wantOK(f.t, f.abort(0, 0, 1), "abort again")
	_, err := f.tryCommit(0, 0, 1)
	wantCode(f.t, err, agentv1.CodeNoSuchRound, "commit after the abort")
	f.want(0, 0, running)
}

// abortBeforePrepare: an abort that overtakes its prepare is remembered:
// the prepare gives the rank up and is refused; other checkpoints are not
// affected.
func abortBeforePrepare(f *fixture) {
	f.run(0, 0)
	wantOK(f.t, f.abort(0, 0, 2), "abort of nothing prepared")
	f.want(0, 0, running)
	_, err := f.tryPrepare(0, 0, 2, long)
	wantCode(f.t, err, agentv1.CodeNoSuchRound, "prepare after its abort")
	f.want(0, 0, running)
	f.prepare(0, 0, 3, long)
	wantOK(f.t, f.abort(0, 0, 3), "abort")
	f.want(0, 0, running)
}

// prepareHoldEnds: a prepared rank that no decision reaches within its
// hold is thawed by the agent, its network unlocked; its image is kept,
// so the prepare stays taken and a late commit succeeds.
func prepareHoldEnds(f *fixture) {
	f.run(0, 0)
	f.prepare(0, 0, 1, f.env.Hold)
	f.await(0, 0, running, f.env.Hold)
	_, err := f.tryPrepare(0, 0, 1, long)
	wantCode(f.t, err, agentv1.CodeExists, "prepare again after the hold")
	f.want(0, 0, running)
	f.commit(0, 0, 1)
	f.want(0, 0, running)
}

// preparedImageExpires: the image of a prepare nobody decided goes
// PendingTTL after its hold: a commit then is refused.
func preparedImageExpires(f *fixture) {
	f.run(0, 0)
	f.prepare(0, 0, 1, f.env.Hold)
	time.Sleep(f.env.Hold + f.env.PendingTTL + time.Second)
	f.want(0, 0, running)
	_, err := f.tryCommit(0, 0, 1)
	wantCode(f.t, err, agentv1.CodeNoSuchRound, "commit after the image expired")
	f.want(0, 0, running)
}

// restore: a rank restores from a committed checkpoint, frozen with its
// network locked, replacing the container it had, until RankResume; a
// checkpoint the node lacks is refused and changes nothing; a restore
// drops the rank's prepares; a rank removed, or stopped keeping its dir,
// restores too.
func restore(f *fixture) {
	f.run(0, 0)
	f.checkpoint(0, 0, 1)
	f.restored(0, 0, 1)
	_, err := f.restore(0, 0, 7)
	wantCode(f.t, err, agentv1.CodeNotFound, "restore from a checkpoint the node lacks")
	f.want(0, 0, frozen)
	wantOK(f.t, f.resume(0, 0), "resume")
	ct := f.want(0, 0, running)
	if ct.RestoredFrom != name(0)+":1" {
		f.t.Errorf("resumed %s restored from %q, want %q", name(0), ct.RestoredFrom, name(0)+":1")
	}
	wantOK(f.t, f.resume(0, 0), "resume again")
	f.want(0, 0, running)

	f.prepare(0, 0, 2, long)
	f.restored(0, 0, 1)
	_, err = f.tryCommit(0, 0, 2)
	wantCode(f.t, err, agentv1.CodeNoSuchRound, "commit of a prepare the restore dropped")
	wantOK(f.t, f.resume(0, 0), "resume")

	wantOK(f.t, f.remove(0, 0, false), "remove")
	f.restored(0, 0, 1)
	wantOK(f.t, f.resume(0, 0), "resume")
	f.want(0, 0, running)

	// A restart onto the same node stops the rank keeping its dir (its
	// output), then restores it.
	wantOK(f.t, f.remove(0, 0, true), "remove keeping the dir")
	ct = f.want(0, 0, exited)
	if ct.ExitCode == nil || *ct.ExitCode != 128+9 {
		f.t.Errorf("%s stopped with exit code %v, want %d", name(0), ct.ExitCode, 128+9)
	}
	f.restored(0, 0, 1)
	wantOK(f.t, f.resume(0, 0), "resume")
	f.want(0, 0, running)
}

// removeEndsHolds: a rank removed while stalled takes its hold with it:
// the end of that hold does not resume the rank restored in its place,
// which stays frozen until its own resume.
func removeEndsHolds(f *fixture) {
	f.run(0, 0)
	f.checkpoint(0, 0, 1)
	wantOK(f.t, f.stall(0, f.env.Hold, 0), "stall")
	wantOK(f.t, f.remove(0, 0, false), "remove the stalled rank")
	f.restored(0, 0, 1)
	time.Sleep(f.env.Hold + time.Second)
	f.want(0, 0, frozen)
	wantOK(f.t, f.resume(0, 0), "resume")
	f.want(0, 0, running)
}

// remove: a removed rank is gone, and its address free; a removal sent
// again succeeds; a removal drops the rank's prepares.
func remove(f *fixture) {
	f.run(0, 0)
	wantOK(f.t, f.remove(0, 0, false), "remove")
	f.want(0, 0, gone)
	wantOK(f.t, f.remove(0, 0, false), "remove again")
	f.run(0, 0)
	f.prepare(0, 0, 1, long)
	wantOK(f.t, f.remove(0, 0, false), "remove a prepared rank")
	f.want(0, 0, gone)
	_, err := f.tryCommit(0, 0, 1)
	wantCode(f.t, err, agentv1.CodeNoSuchRound, "commit of a prepare the removal dropped")
}

// migrateOut: the source of a migration removes the rank and drops its
// prepare; a move-out sent again succeeds.
func migrateOut(f *fixture) {
	f.run(0, 0)
	f.prepare(0, 0, 1, long)
	wantOK(f.t, f.migrateOut(0, 0, 1), "move out")
	f.want(0, 0, gone)
	wantOK(f.t, f.migrateOut(0, 0, 1), "move out again")
	_, err := f.tryCommit(0, 0, 1)
	wantCode(f.t, err, agentv1.CodeNoSuchRound, "commit of the moved rank's prepare")
	wantOK(f.t, f.abort(0, 0, 1), "abort of the moved rank's prepare")
}

// migrateIn: a rank prepared on one node is restored on another, frozen
// with its network locked, and runs there once resumed; a move from a
// node where nothing is prepared is refused.
func migrateIn(f *fixture) {
	f.run(0, 0)
	f.prepare(0, 0, 1, long)
	in, err := f.migrateIn(1, 0, 0, 1, long)
	mustOK(f.t, err, "move in")
	if in.Bytes <= 0 {
		f.t.Errorf("move in received %d bytes", in.Bytes)
	}
	f.want(1, 0, frozen)
	f.want(0, 0, frozen)
	wantOK(f.t, f.migrateOut(0, 0, 1), "move out")
	f.want(0, 0, gone)
	wantOK(f.t, f.resume(1, 0), "resume")
	f.want(1, 0, running)

	_, err = f.migrateIn(1, 0, 0, 2, long)
	wantCode(f.t, err, agentv1.CodeNotFound, "move in of a rank not prepared at its source")
	f.want(1, 0, running)
	ctx, cancel := f.ctx()
	defer cancel()
	_, err = f.agent(1).MigrateIn(ctx, agentv1.MigrateIn{Rank: rank(0), Seq: 2, From: silent.Addr, FromNode: silent.Name,
		Net: f.jobNet(1, nil), Addr: addr(0), Hold: long})
	wantCode(f.t, err, agentv1.CodeInternal, "move in from a node that does not answer")
	f.want(1, 0, running)
}

// migrateInHoldEnds: a migrated-in rank that no resume reaches within its
// hold is removed (its source thaws by its own hold, or the abort).
func migrateInHoldEnds(f *fixture) {
	f.run(0, 0)
	f.prepare(0, 0, 1, long)
	_, err := f.migrateIn(1, 0, 0, 1, f.env.Hold)
	mustOK(f.t, err, "move in")
	f.want(1, 0, frozen)
	f.await(1, 0, gone, f.env.Hold)
	f.want(0, 0, frozen)
	wantOK(f.t, f.abort(0, 0, 1), "abort at the source")
	f.want(0, 0, running)
}

// jobNet: a job network is set and set again alike; a rank attached to
// the node cannot be listed as remote, nor a remote rank at the node's
// own address, and the refusal changes nothing; once the rank is
// removed, or stopped keeping its dir (with or without its network named),
// it may; dropping the network
// leaves the address of a rank still on it taken; dropping it twice, or
// where there is none, succeeds.
func jobNet(f *fixture) {
	wantOK(f.t, f.setJobNet(0, f.jobNet(0, map[int]int{1: 1})), "set the job network")
	wantOK(f.t, f.setJobNet(0, f.jobNet(0, map[int]int{1: 1})), "set the job network again")
	f.run(0, 0)
	wantCode(f.t, f.setJobNet(0, f.jobNet(0, map[int]int{0: 1, 1: 1})), agentv1.CodeInternal, "list a rank attached here as remote")
	wantCode(f.t, f.setJobNet(0, f.jobNet(0, map[int]int{1: 0})), agentv1.CodeInternal, "list a remote rank at this node's address")
	f.want(0, 0, running)

	f.run(0, 2)
	wantOK(f.t, f.remove(0, 2, true), "remove keeping the dir")
	f.want(0, 2, exited)
	wantOK(f.t, f.setJobNet(0, f.jobNet(0, map[int]int{1: 1, 2: 1})), "list a rank stopped here as remote")
	// As the agent stops a rank by itself (fenced, or placed elsewhere
	// now): the request names no address; the rank lets go of its own.
	f.run(0, 3)
	wantOK(f.t, f.stop(0, 3), "stop naming no network")
	f.want(0, 3, exited)
	wantOK(f.t, f.setJobNet(0, f.jobNet(0, map[int]int{1: 1, 2: 1, 3: 1})), "list a rank stopped here, its network not named, as remote")
	wantOK(f.t, f.remove(0, 0, false), "remove")
	wantOK(f.t, f.setJobNet(0, f.jobNet(0, map[int]int{0: 1, 1: 1, 2: 1})), "list a rank removed here as remote")

	// Dropping the job network leaves a rank still on it as it was, its
	// address taken.
	f.run(0, 1)
	wantOK(f.t, f.dropJobNet(0), "drop the job network")
	f.want(0, 1, running)
	_, err := f.rankRun(0, 1)
	wantCode(f.t, err, agentv1.CodeInternal, "run %s again once its network is dropped", name(1))
	wantOK(f.t, f.dropJobNet(0), "drop the job network again")
	wantOK(f.t, f.dropJobNet(1), "drop a job network the node never had")
}

// fetch: a node copies a committed image from its holder, and a restore
// from it runs there; a fetch sent again finds it there; a fetch of an
// image its holder lacks is refused.
func fetch(f *fixture) {
	f.run(0, 0)
	f.checkpoint(0, 0, 1)
	img, err := f.fetch(1, 0, 0, 1)
	mustOK(f.t, err, "fetch")
	if !img.Fetched || img.Container != name(0) || img.Seq != 1 || img.Bytes <= 0 {
		f.t.Errorf("fetch answered %s:%d fetched %v, %d bytes; want %s:1 fetched", img.Container, img.Seq, img.Fetched, img.Bytes, name(0))
	}
	again, err := f.fetch(1, 0, 0, 1)
	mustOK(f.t, err, "fetch again")
	if again.Fetched || again.Container != name(0) || again.Seq != 1 || again.Size != img.Size {
		f.t.Errorf("fetch again answered %s:%d of %d bytes fetched %v; want %s:1 of %d bytes, already there", again.Container, again.Seq, again.Size, again.Fetched, name(0), img.Size)
	}
	f.restored(1, 0, 1)
	wantOK(f.t, f.resume(1, 0), "resume")
	f.want(1, 0, running)

	_, err = f.fetch(1, 0, 0, 2)
	wantCode(f.t, err, agentv1.CodeNotFound, "fetch of an image the holder lacks")
	ctx, cancel := f.ctx()
	defer cancel()
	_, err = f.agent(1).Fetch(ctx, agentv1.Fetch{Container: name(0), Seq: 2, From: silent.Addr, FromNode: silent.Name})
	wantCode(f.t, err, agentv1.CodeInternal, "fetch from a holder that does not answer")
}

// tierFlushFetch: an image flushed to the tier by one node is fetched by
// the other from its record, and restores there; a second flush uploads
// nothing new; a record of another image is refused as damaged; a
// checkpoint record written through one node is read through the other,
// and goes with a prune that keeps nothing; a flush of an image the node
// lacks is not found.
func tierFlushFetch(f *fixture) {
	ctx, cancel := f.ctx()
	defer cancel()
	url := f.env.Tier(f.t)
	f.run(0, 0)
	f.checkpoint(0, 0, 1)
	ref := agentv1.ImageRef{Container: name(0), Seq: 1}
	out, err := f.agent(0).TierFlush(ctx, agentv1.TierFlush{URL: url, Images: []agentv1.ImageRef{ref}})
	mustOK(f.t, err, "flush %s:1", name(0))
	if len(out.Images) != 1 || out.Images[0].ImageRef != ref || len(out.Images[0].Record) == 0 || out.Images[0].Manifest == "" ||
		out.Images[0].Chunks == 0 || out.Images[0].NewChunks != out.Images[0].Chunks {
		f.t.Fatalf("flush answered %+v, want %s:1 with its record, every chunk new", out, name(0))
	}
	again, err := f.agent(0).TierFlush(ctx, agentv1.TierFlush{URL: url, Images: []agentv1.ImageRef{ref}})
	mustOK(f.t, err, "flush again")
	if len(again.Images) != 1 || again.Images[0].NewChunks != 0 {
		f.t.Errorf("flush again answered %+v, want nothing new", again)
	}
	_, err = f.agent(0).TierFlush(ctx, agentv1.TierFlush{URL: url, Images: []agentv1.ImageRef{{Container: name(0), Seq: 9}}})
	wantCode(f.t, err, agentv1.CodeNotFound, "flush of an image the node lacks")

	rec := out.Images[0].Record
	// Lazily from the tier onto a node without the image: restored frozen
	// at once, then resumed; a record of another image is refused.
	lazy := func(r int) (agentv1.Container, error) {
		return f.agent(1).RankRestore(ctx, agentv1.RankRestore{Rank: rank(r), Net: f.jobNet(1, nil), Addr: addr(r), Seq: 1,
			Tier: &agentv1.TierSource{URL: url, Record: rec}})
	}
	_, err = lazy(1)
	wantCode(f.t, err, agentv1.CodeCorrupt, "lazy restore from the tier with the record of another image")
	_, err = lazy(0)
	mustOK(f.t, err, "lazy restore of %s:1 from the tier", name(0))
	f.want(1, 0, frozen)
	wantOK(f.t, f.resume(1, 0), "resume the lazily restored rank")
	f.want(1, 0, running)
	wantOK(f.t, f.remove(1, 0, false), "remove the lazily restored rank")

	_, err = f.agent(1).TierFetch(ctx, agentv1.TierFetch{URL: url, ImageRef: agentv1.ImageRef{Container: name(1), Seq: 1}, Record: rec})
	wantCode(f.t, err, agentv1.CodeCorrupt, "fetch with the record of another image")
	img, err := f.agent(1).TierFetch(ctx, agentv1.TierFetch{URL: url, ImageRef: ref, Record: rec})
	mustOK(f.t, err, "fetch %s:1 from the tier", name(0))
	if !img.Fetched || img.Container != name(0) || img.Seq != 1 {
		f.t.Errorf("fetch answered %+v, want %s:1 fetched", img, name(0))
	}
	img, err = f.agent(1).TierFetch(ctx, agentv1.TierFetch{URL: url, ImageRef: ref, Record: rec})
	mustOK(f.t, err, "fetch again")
	if img.Fetched {
		f.t.Errorf("fetch again fetched it again")
	}
	f.restored(1, 0, 1)
	wantOK(f.t, f.resume(1, 0), "resume")
	f.want(1, 0, running)

	data := []byte(`{"checkpoint":1}`)
	mustOK(f.t, f.agent(0).TierRecord(ctx, agentv1.TierRecord{URL: url, Seq: 1, Data: data}), "write a record")
	got, err := f.agent(1).TierRead(ctx, agentv1.TierRead{URL: url})
	mustOK(f.t, err, "read the newest record")
	if got.Seq != 1 || string(got.Data) != string(data) {
		f.t.Errorf("read the newest record: %d %s, want 1 %s", got.Seq, got.Data, data)
	}
	_, err = f.agent(1).TierPrune(ctx, agentv1.TierPrune{URL: url, Records: []int{}, Manifests: []string{}})
	mustOK(f.t, err, "prune everything")
	_, err = f.agent(1).TierRead(ctx, agentv1.TierRead{URL: url})
	wantCode(f.t, err, agentv1.CodeNotFound, "read after the prune")
	_, err = f.agent(0).TierFetch(ctx, agentv1.TierFetch{URL: url, ImageRef: agentv1.ImageRef{Container: name(0), Seq: 2}, Record: rec})
	if err == nil {
		f.t.Errorf("fetch of a pruned image answered no error")
	}
}

// dropImages: dropped images are gone from the node: a restore from one
// is refused, and so is a commit sent again; dropping again drops none.
// A drop narrowed to checkpoints drops only those.
func dropImages(f *fixture) {
	f.run(0, 0)
	f.checkpoint(0, 0, 1)
	f.checkpoint(0, 0, 2)
	// Narrowed to checkpoints: only those go (retention).
	d, err := f.dropImagesOf(0, 0, 2, 7)
	mustOK(f.t, err, "drop image 2")
	if d.Images != 1 {
		f.t.Errorf("dropped %d images of checkpoints 2 and 7, want 1", d.Images)
	}
	_, err = f.restore(0, 0, 2)
	wantCode(f.t, err, agentv1.CodeNotFound, "restore from a dropped image")
	f.want(0, 0, running)
	d, err = f.dropImages(0, 0)
	mustOK(f.t, err, "drop images")
	if d.Images != 1 {
		f.t.Errorf("dropped %d images, want 1", d.Images)
	}
	d, err = f.dropImages(0, 0)
	mustOK(f.t, err, "drop images again")
	if d.Images != 0 {
		f.t.Errorf("dropped %d images again, want 0", d.Images)
	}
	_, err = f.restore(0, 0, 1)
	wantCode(f.t, err, agentv1.CodeNotFound, "restore from a dropped image")
	f.want(0, 0, running)
	_, err = f.tryCommit(0, 0, 1)
	wantCode(f.t, err, agentv1.CodeNoSuchRound, "commit of a dropped image")
}
