package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
)

// fakeRanks are rankOps that record what the participant asks of them.
type fakeRanks struct {
	mu     sync.Mutex
	events []string
	stored map[ckptKey]bool
	// dump, if not nil, holds every Prepare until it is closed; ingest
	// likewise every Commit.
	dump, ingest chan struct{}
	failFreeze   map[string]bool
}

func newFakeRanks() *fakeRanks {
	return &fakeRanks{stored: map[ckptKey]bool{}, failFreeze: map[string]bool{}}
}

func (f *fakeRanks) record(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, fmt.Sprintf(format, args...))
}

// took returns what was asked since the last call.
func (f *fakeRanks) took() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	ev := f.events
	f.events = nil
	return ev
}

func (f *fakeRanks) AwaitMemory(ctx context.Context, name string, within time.Duration) (time.Duration, error) {
	return 0, nil
}

func (f *fakeRanks) Prepare(ctx context.Context, name string, seq int) (stagedRank, error) {
	f.record("prepare %s:%d", name, seq)
	if f.dump != nil {
		<-f.dump
	}
	return &fakeStaged{f: f, key: ckptKey{name, seq}}, nil
}

func (f *fakeRanks) Decided(name string, seq int, committed bool) {}

func (f *fakeRanks) EndAtCheckpoint(ctx context.Context, name string) error {
	f.record("end %s", name)
	return nil
}

func (f *fakeRanks) Stored(name string, seq int) (*image.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.stored[ckptKey{name, seq}] {
		return nil, fmt.Errorf("%w: %s:%d", image.ErrNotFound, name, seq)
	}
	return &image.Record{Container: name, Seq: seq}, nil
}

func (f *fakeRanks) Lock(ctx context.Context, name string) error {
	f.record("lock %s", name)
	return nil
}

func (f *fakeRanks) Freeze(ctx context.Context, name string) error {
	f.record("freeze %s", name)
	if f.failFreeze[name] {
		return errors.New("freezer stuck")
	}
	return nil
}

func (f *fakeRanks) Resume(ctx context.Context, name string) error {
	f.record("resume %s", name)
	return nil
}

type fakeStaged struct {
	f   *fakeRanks
	key ckptKey
}

func (s *fakeStaged) Thaw(ctx context.Context) error {
	s.f.record("thaw %s:%d", s.key.rank, s.key.ckpt)
	return nil
}

func (s *fakeStaged) Stop(ctx context.Context) error {
	s.f.record("stop %s:%d", s.key.rank, s.key.ckpt)
	return nil
}

func (s *fakeStaged) Commit(ctx context.Context) (*image.Record, error) {
	s.f.record("commit %s:%d", s.key.rank, s.key.ckpt)
	if s.f.ingest != nil {
		<-s.f.ingest
	}
	s.f.mu.Lock()
	s.f.stored[s.key] = true
	s.f.mu.Unlock()
	rec := &image.Record{Container: s.key.rank, Seq: s.key.ckpt}
	rec.Timing.Stall = time.Second
	return rec, nil
}

func (s *fakeStaged) Abort(ctx context.Context) error {
	s.f.record("abort %s:%d", s.key.rank, s.key.ckpt)
	return nil
}

func (s *fakeStaged) Size() int64             { return 1 << 20 }
func (s *fakeStaged) CRIUTime() time.Duration { return 0 }
func (s *fakeStaged) ImageDir() string        { return "" }
func (s *fakeStaged) Record() image.Record {
	return image.Record{Container: s.key.rank, Seq: s.key.ckpt}
}

const testHold = 10 * time.Second

var r0c1 = ckptKey{"j.0", 1}

// participantTest runs test in a synctest bubble with a participant on
// fake ranks: time there moves only when every goroutine waits.
func participantTest(t *testing.T, test func(t *testing.T, p *participant, f *fakeRanks)) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		f := newFakeRanks()
		p := newParticipant(f, slog.New(slog.NewTextHandler(t.Output(), nil)))
		test(t, p, f)
	})
}

func wantEvents(t *testing.T, f *fakeRanks, want ...string) {
	t.Helper()
	if diff := cmp.Diff(want, f.took()); diff != "" {
		t.Errorf("asked of the ranks (-want +got):\n%s", diff)
	}
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	var e *agentv1.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Errorf("error %v, want API error %s", err, code)
	}
}

// afterEverything lets every hold and expiry pass.
func afterEverything() {
	time.Sleep(testHold + PendingTTL + time.Minute)
	synctest.Wait()
}

func mustPrepare(t *testing.T, p *participant, key ckptKey) {
	t.Helper()
	if _, err := p.prepare(t.Context(), key, testHold, 0); err != nil {
		t.Fatalf("prepare %v: %v", key, err)
	}
}

func TestParticipantPrepareCommit(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		out, err := p.prepare(t.Context(), r0c1, testHold, 0)
		if err != nil || out.Size != 1<<20 {
			t.Fatalf("prepare: %+v %v", out, err)
		}
		wantEvents(t, f, "prepare j.0:1")
		if p.staged(r0c1) == nil {
			t.Error("a prepared rank has no staged image to stream")
		}
		c, err := p.commit(t.Context(), r0c1)
		if err != nil || c.Seq != 1 || c.Stall != time.Second {
			t.Fatalf("commit: %+v %v", c, err)
		}
		wantEvents(t, f, "thaw j.0:1", "commit j.0:1")
		// A commit sent again is answered from the store.
		c, err = p.commit(t.Context(), r0c1)
		if err != nil || c.Seq != 1 || c.Stall != 0 {
			t.Fatalf("commit sent again: %+v %v", c, err)
		}
		afterEverything()
		wantEvents(t, f)
	})
}

// TestParticipantCommitAndStop: a commit with stop ends the rank instead
// of thawing it, before its image is stored; sent again (or after the
// prepare was lost), it ends whatever of the rank still runs.
func TestParticipantCommitAndStop(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		mustPrepare(t, p, r0c1)
		c, err := p.commitAndStop(t.Context(), r0c1)
		if err != nil || c.Seq != 1 {
			t.Fatalf("commit and stop: %+v %v", c, err)
		}
		wantEvents(t, f, "prepare j.0:1", "stop j.0:1", "commit j.0:1")
		// The hold that would have thawed it is disarmed.
		time.Sleep(testHold + PendingTTL)
		synctest.Wait()
		wantEvents(t, f)
		c, err = p.commitAndStop(t.Context(), r0c1)
		if err != nil || c.Seq != 1 {
			t.Fatalf("commit and stop sent again: %+v %v", c, err)
		}
		wantEvents(t, f, "end j.0")
		// Nothing prepared and nothing stored: refused, and ended all
		// the same.
		_, err = p.commitAndStop(t.Context(), ckptKey{"j.1", 1})
		wantCode(t, err, agentv1.CodeNoSuchRound)
		wantEvents(t, f, "end j.1")
	})
}

// TestParticipantStopAfterHold: a rank its hold thawed ran on; a late
// commit with stop ends it all the same.
func TestParticipantStopAfterHold(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		mustPrepare(t, p, r0c1)
		time.Sleep(testHold)
		synctest.Wait()
		wantEvents(t, f, "prepare j.0:1", "thaw j.0:1")
		if _, err := p.commitAndStop(t.Context(), r0c1); err != nil {
			t.Fatal(err)
		}
		wantEvents(t, f, "stop j.0:1", "commit j.0:1")
	})
}

func TestParticipantPrepareAbort(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		mustPrepare(t, p, r0c1)
		if err := p.abort(t.Context(), r0c1); err != nil {
			t.Fatal(err)
		}
		wantEvents(t, f, "prepare j.0:1", "thaw j.0:1", "abort j.0:1")
		_, err := p.commit(t.Context(), r0c1)
		wantCode(t, err, agentv1.CodeNoSuchRound)
		afterEverything()
		wantEvents(t, f)
	})
}

// TestParticipantHoldExpiry: a rank without a decision runs again at the
// end of its hold and its image is kept for a late commit, then dropped
// PendingTTL later.
func TestParticipantHoldExpiry(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		mustPrepare(t, p, r0c1)
		mustPrepare(t, p, ckptKey{"j.1", 1})
		wantEvents(t, f, "prepare j.0:1", "prepare j.1:1")
		time.Sleep(testHold - time.Millisecond)
		synctest.Wait()
		wantEvents(t, f)
		time.Sleep(time.Millisecond)
		synctest.Wait()
		got := f.took()
		slices.Sort(got) // two timers at one instant
		if diff := cmp.Diff([]string{"thaw j.0:1", "thaw j.1:1"}, got); diff != "" {
			t.Errorf("at the end of the hold (-want +got):\n%s", diff)
		}
		// A late commit stores the kept image; the rank is not thawed again.
		if _, err := p.commit(t.Context(), r0c1); err != nil {
			t.Fatal(err)
		}
		wantEvents(t, f, "commit j.0:1")
		// Nobody decides j.1: its image goes PendingTTL later.
		time.Sleep(PendingTTL)
		synctest.Wait()
		wantEvents(t, f, "abort j.1:1")
		_, err := p.commit(t.Context(), ckptKey{"j.1", 1})
		wantCode(t, err, agentv1.CodeNoSuchRound)
	})
}

func TestParticipantSecondPrepare(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		// While the first dumps.
		f.dump = make(chan struct{})
		first := make(chan error)
		go func() {
			_, err := p.prepare(t.Context(), r0c1, testHold, 0)
			first <- err
		}()
		synctest.Wait()
		_, err := p.prepare(t.Context(), r0c1, testHold, 0)
		if !errors.Is(err, container.ErrExists) || !strings.Contains(err.Error(), "being prepared") {
			t.Errorf("second prepare while the first dumps: %v", err)
		}
		close(f.dump)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		// Once it is prepared.
		_, err = p.prepare(t.Context(), r0c1, testHold, 0)
		if !errors.Is(err, container.ErrExists) || !strings.Contains(err.Error(), "already prepared") {
			t.Errorf("second prepare of a prepared rank: %v", err)
		}
		wantEvents(t, f, "prepare j.0:1")
		// The first is still the one decided.
		if _, err := p.commit(t.Context(), r0c1); err != nil {
			t.Fatal(err)
		}
		wantEvents(t, f, "thaw j.0:1", "commit j.0:1")
	})
}

func TestParticipantCommitUnknown(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		mustPrepare(t, p, r0c1)
		f.took()
		_, err := p.commit(t.Context(), ckptKey{"j.0", 2})
		wantCode(t, err, agentv1.CodeNoSuchRound)
		_, err = p.commit(t.Context(), ckptKey{"j.1", 1})
		wantCode(t, err, agentv1.CodeNoSuchRound)
		wantEvents(t, f)
		if p.staged(r0c1) == nil {
			t.Error("a commit of another checkpoint touched this one")
		}
	})
}

func TestParticipantAbortAfterCommit(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		mustPrepare(t, p, r0c1)
		if _, err := p.commit(t.Context(), r0c1); err != nil {
			t.Fatal(err)
		}
		f.took()
		if err := p.abort(t.Context(), r0c1); err != nil {
			t.Errorf("abort after commit: %v", err)
		}
		wantEvents(t, f)
		if _, err := p.commit(t.Context(), r0c1); err != nil {
			t.Errorf("the checkpoint is still committed: %v", err)
		}
	})
}

// TestParticipantAbortWhilePreparing: an abort that comes while the rank
// dumps answers once the rank runs again, and the prepare gives up.
func TestParticipantAbortWhilePreparing(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		f.dump = make(chan struct{})
		prepared := make(chan error)
		go func() {
			_, err := p.prepare(t.Context(), r0c1, testHold, 0)
			prepared <- err
		}()
		synctest.Wait()
		aborted := make(chan error)
		go func() { aborted <- p.abort(t.Context(), r0c1) }()
		synctest.Wait()
		select {
		case err := <-aborted:
			t.Fatalf("abort answered while the rank still dumps: %v", err)
		default:
		}
		close(f.dump)
		wantCode(t, <-prepared, agentv1.CodeNoSuchRound)
		if err := <-aborted; err != nil {
			t.Fatal(err)
		}
		wantEvents(t, f, "prepare j.0:1", "thaw j.0:1", "abort j.0:1")
		afterEverything()
		wantEvents(t, f)
	})
}

// TestParticipantAbortBeforePrepare: an abort that overtakes its prepare
// is not lost.
func TestParticipantAbortBeforePrepare(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		if err := p.abort(t.Context(), r0c1); err != nil {
			t.Fatal(err)
		}
		_, err := p.prepare(t.Context(), r0c1, testHold, 0)
		wantCode(t, err, agentv1.CodeNoSuchRound)
		wantEvents(t, f, "prepare j.0:1", "thaw j.0:1", "abort j.0:1")
		// Only once: the next prepare of it goes ahead.
		mustPrepare(t, p, r0c1)
		wantEvents(t, f, "prepare j.0:1")
	})
}

// TestParticipantCommitTwice: a commit sent again while the first stores
// the image waits for it.
func TestParticipantCommitTwice(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		mustPrepare(t, p, r0c1)
		f.ingest = make(chan struct{})
		go p.commit(t.Context(), r0c1)
		synctest.Wait()
		again := make(chan error)
		go func() {
			_, err := p.commit(t.Context(), r0c1)
			again <- err
		}()
		synctest.Wait()
		select {
		case err := <-again:
			t.Fatalf("a commit sent again answered before the image was stored: %v", err)
		default:
		}
		close(f.ingest)
		if err := <-again; err != nil {
			t.Fatal(err)
		}
		wantEvents(t, f, "prepare j.0:1", "thaw j.0:1", "commit j.0:1")
	})
}

// TestParticipantMigrateOut: a prepared rank that moved away is dropped
// with its network still locked, and nothing of it happens later.
func TestParticipantMigrateOut(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		mustPrepare(t, p, r0c1)
		if err := p.migrateOut(t.Context(), r0c1); err != nil {
			t.Fatal(err)
		}
		wantEvents(t, f, "prepare j.0:1", "abort j.0:1")
		if p.staged(r0c1) != nil {
			t.Error("a rank that moved away still has a staged image")
		}
		afterEverything()
		wantEvents(t, f)
		// Moving a rank with nothing prepared does nothing.
		if err := p.migrateOut(t.Context(), r0c1); err != nil {
			t.Error(err)
		}
		wantEvents(t, f)
	})
}

func TestParticipantDropRank(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		mustPrepare(t, p, r0c1)
		mustPrepare(t, p, ckptKey{"j.1", 1})
		f.took()
		p.dropRank(t.Context(), "j.0")
		wantEvents(t, f, "thaw j.0:1", "abort j.0:1")
		if p.staged(ckptKey{"j.1", 1}) == nil {
			t.Error("another rank's prepare was dropped")
		}
	})
}

// TestParticipantStall: stalled ranks resume on RankResume, or by
// themselves at the end of their hold.
func TestParticipantStall(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		if err := p.stall(t.Context(), []string{"j.1", "j.2"}, testHold); err != nil {
			t.Fatal(err)
		}
		wantEvents(t, f, "lock j.1", "freeze j.1", "lock j.2", "freeze j.2")
		if err := p.resume(t.Context(), []string{"j.1"}); err != nil {
			t.Fatal(err)
		}
		wantEvents(t, f, "resume j.1")
		time.Sleep(testHold)
		synctest.Wait()
		wantEvents(t, f, "resume j.2")
		afterEverything()
		wantEvents(t, f)
	})
}

// TestParticipantStallFails: a stall is all or nothing.
func TestParticipantStallFails(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		f.failFreeze["j.2"] = true
		err := p.stall(t.Context(), []string{"j.1", "j.2", "j.3"}, testHold)
		if err == nil || !strings.Contains(err.Error(), "stall j.2") {
			t.Fatalf("stall: %v", err)
		}
		wantEvents(t, f, "lock j.1", "freeze j.1", "lock j.2", "freeze j.2", "resume j.1", "resume j.2")
		afterEverything()
		wantEvents(t, f)
	})
}

// TestParticipantHold: a migrated-in rank's hold runs what it was given
// unless released; a new hold replaces the old.
func TestParticipantHold(t *testing.T) {
	participantTest(t, func(t *testing.T, p *participant, f *fakeRanks) {
		p.hold("j.0", testHold, func() { f.record("remove j.0") })
		p.hold("j.1", testHold, func() { f.record("remove j.1 (first hold)") })
		p.hold("j.1", 2*testHold, func() { f.record("remove j.1") })
		p.release("j.0")
		time.Sleep(testHold)
		synctest.Wait()
		wantEvents(t, f)
		time.Sleep(testHold)
		synctest.Wait()
		wantEvents(t, f, "remove j.1")
	})
}
