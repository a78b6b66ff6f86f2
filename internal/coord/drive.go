package coord

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// How the driver performs an action of a protocol machine.
type actionKind uint8

const (
	// inline: performed before the next action of its Step; what comes
	// of it is stepped once the Step's actions are all under way.
	inline actionKind = iota
	// concurrent: performed on a goroutine of its own; what comes of it
	// is stepped when it ends. Its ctx ends with the run.
	concurrent
	// awaited: concurrent, but the run waits for it to end before it
	// returns, and its ctx does not end with the run (an abort that must
	// reach its agent).
	awaited
	// final: the run's last action; the driver stops stepping.
	final
)

// machineRun describes one run of a protocol machine for drive: a
// machine's Step, and how to perform its actions.
type machineRun[E, A any] struct {
	step func(now time.Time, ev E) ([]A, error)
	// kind says how a is performed.
	kind func(a A) actionKind
	// perform does a and returns the event that comes of it; ok false
	// when none does.
	perform func(ctx context.Context, a A) (ev E, ok bool)
	// tick, if every is set, is stepped every so often (a machine with a
	// deadline notices it without a reply).
	tick  E
	every time.Duration
	// inputs, if set, brings events from outside the run (a node lost).
	inputs <-chan E
	log    *slog.Logger
}

// drive steps first into a machine, then performs every action it returns
// and steps back what comes of each, until a final action, which it
// returns. Only drive steps the machine: it is never stepped
// concurrently. If ctx ends first, drive returns ctx's error.
func drive[E, A any](ctx context.Context, run machineRun[E, A], first E) (A, error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup // awaited actions
	defer wg.Wait()
	// Buffered: a round of 10,000 ranks has as many replies coming in
	// at once, each of which would otherwise wait for the loop.
	events := make(chan E, 256)
	stopped := make(chan struct{}) // drive reads no more events
	defer close(stopped)
	send := func(ev E) {
		select {
		case events <- ev:
		case <-stopped:
		}
	}
	var end A
	ended := false
	var queue []E
	step := func(ev E) {
		acts, err := run.step(time.Now(), ev)
		if err != nil {
			run.log.Debug("machine ignored an event", "err", err)
		}
		for _, a := range acts {
			switch run.kind(a) {
			case final:
				end, ended = a, true
			case inline:
				if ev, ok := run.perform(ctx, a); ok {
					queue = append(queue, ev)
				}
			case concurrent:
				go func() {
					if ev, ok := run.perform(cctx, a); ok {
						send(ev)
					}
				}()
			case awaited:
				wg.Add(1)
				go func() {
					defer wg.Done()
					if ev, ok := run.perform(ctx, a); ok {
						send(ev)
					}
				}()
			}
		}
	}
	queue = append(queue, first)
	var tick <-chan time.Time
	if run.every > 0 {
		t := time.NewTicker(run.every)
		defer t.Stop()
		tick = t.C
	}
	for {
		for len(queue) > 0 && !ended {
			ev := queue[0]
			queue = queue[1:]
			step(ev)
		}
		if ended {
			return end, nil
		}
		select {
		case ev := <-events:
			queue = append(queue, ev)
		case ev := <-run.inputs:
			queue = append(queue, ev)
		case <-tick:
			queue = append(queue, run.tick)
		case <-ctx.Done():
			return end, ctx.Err()
		}
	}
}
