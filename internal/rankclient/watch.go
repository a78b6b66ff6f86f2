package rankclient

import (
	"context"
	"encoding/json"

	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
)

// Watcher is what Watch calls back, on Watch's goroutine, one call at a
// time; nil functions are skipped.
type Watcher struct {
	// DeadlineMS is how long Prepare may take (0: what the round has
	// left).
	DeadlineMS int
	// Prepare runs before the rank is frozen for checkpoint ckpt (or a
	// migration): flush, quiesce, close connections to outside services;
	// in application-level mode (mode app), save the rank's state. Watch
	// answers ready when it returns nil; an error leaves the prepare
	// unanswered, and the round fails.
	Prepare func(ckpt int, mode string) error
	// Resumed runs when the rank runs on, not restored, after a prepare
	// or a checkpoint: ckpt is the job's newest checkpoint, the prepare's
	// if it was taken, an older one if the round aborted.
	Resumed func(ckpt int)
	// Restored runs when the rank runs restored from checkpoint from, in
	// a new incarnation: reconnect to outside services.
	Restored func(from int)
	// Watching, if set, runs with the reply to each watch, once the rank
	// is registered (again).
	Watching func(Info)
}

// Watch registers the rank to be told before its job's checkpoints and
// calls w back around them until ctx ends. When the agent closes the
// watch connection (the rank is frozen), Watch watches again once the
// endpoint is back and, comparing the reply with the previous one, calls
// Restored (the incarnation grew) or Resumed (the newest checkpoint grew,
// or a prepare was answered). It returns ctx's error, or an error that
// trying again would not mend (ErrForbidden, say).
func (c *Client) Watch(ctx context.Context, w Watcher) error {
	req := rankv1.Request{Op: rankv1.OpWatch, Prepare: true, DeadlineMS: w.DeadlineMS}
	var prev *Info
	prepared := false
	for {
		conn, rd, r, err := c.open(ctx, req)
		if err != nil {
			return err
		}
		cur := infoOf(r)
		switch {
		case prev == nil:
		case cur.Incarnation > prev.Incarnation:
			if w.Restored != nil {
				w.Restored(cur.RestoredFrom)
			}
		case cur.Ckpt > prev.Ckpt || prepared:
			if w.Resumed != nil {
				w.Resumed(cur.Ckpt)
			}
		}
		prev, prepared = &cur, false
		if w.Watching != nil {
			w.Watching(cur)
		}
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		for {
			line, err := readLine(rd)
			if err != nil {
				break
			}
			var ev rankv1.Event
			if json.Unmarshal(line, &ev) != nil || ev.Event != rankv1.EventPrepare {
				continue // not an event of this version's
			}
			prepared = true
			mode := ev.Mode
			if mode == "" {
				mode = cur.Mode
			}
			if w.Prepare != nil && w.Prepare(ev.Ckpt, mode) != nil {
				break
			}
			if _, err := conn.Write([]byte(`{"op":"ready"}` + "\n")); err != nil {
				break
			}
		}
		stop()
		conn.Close()
		if err := c.wait(ctx); err != nil {
			return err
		}
	}
}
