package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// Config is how a demo runs.
type Config struct {
	// Out is where the demo tells what it does; Color uses terminal
	// colours there.
	Out   io.Writer
	Color bool
	// Keep leaves what the demo made for a look afterwards.
	Keep bool
	// Exe is the cairn binary the programs and commands run (default:
	// this executable).
	Exe string
	// Staging is the staging dir the container demo uses a dir of (demo);
	// CRIU and Runc its binaries.
	Staging, CRIU, Runc string
	// Messages is how many messages each rank of the cluster demo's ring
	// handles.
	Messages int
}

// script prints a demo's numbered steps, their details and checks.
type script struct {
	w     io.Writer
	color bool
	step  int
}

func (d *script) say(format string, a ...any) {
	d.step++
	msg := fmt.Sprintf(format, a...)
	if d.color {
		fmt.Fprintf(d.w, "\n\033[1;36m[%d]\033[0m \033[1m%s\033[0m\n", d.step, msg)
	} else {
		fmt.Fprintf(d.w, "\n[%d] %s\n", d.step, msg)
	}
}

func (d *script) detail(format string, a ...any) { fmt.Fprintf(d.w, "    "+format+"\n", a...) }

// check prints a check's outcome; a failed one is the demo's error.
func (d *script) check(ok bool, format string, a ...any) error {
	msg := fmt.Sprintf(format, a...)
	mark := "✔"
	if !ok {
		mark = "✘"
	}
	if d.color {
		color := "32"
		if !ok {
			color = "31"
		}
		fmt.Fprintf(d.w, "    \033[%sm%s\033[0m %s\n", color, mark, msg)
	} else {
		fmt.Fprintf(d.w, "    %s %s\n", mark, msg)
	}
	if !ok {
		return errors.New("demo check failed: " + msg)
	}
	return nil
}

// waitFor polls cond until it holds, for at most d.
func waitFor(ctx context.Context, d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
