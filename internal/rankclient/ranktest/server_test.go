package ranktest_test

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
	"github.com/cairn-hpc/cairn/internal/rankclient/ranktest"
)

// exchange sends line on a new connection and returns the reply, after
// checking that the server then closes the connection.
func exchange(t *testing.T, s *ranktest.Server, line string) rankv1.Reply {
	t.Helper()
	conn, err := net.Dial("unix", s.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, line); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	b, err := r.ReadBytes('\n')
	if err != nil {
		t.Fatalf("%.60q: reply: %v", line, err)
	}
	var reply rankv1.Reply
	if err := json.Unmarshal(b, &reply); err != nil {
		t.Fatalf("%.60q: reply %q: %v", line, b, err)
	}
	if rest, err := r.ReadByte(); err != io.EOF {
		t.Errorf("%.60q: after the reply: %q, %v; want the connection closed", line, rest, err)
	}
	return reply
}

func newServer(t *testing.T, cfg ranktest.Config) *ranktest.Server {
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	return ranktest.New(t, cfg)
}

// TestRankFakeRefuses: what the spec refuses, the fake refuses with the
// spec's code; a good request after them is answered.
func TestRankFakeRefuses(t *testing.T) {
	s := newServer(t, ranktest.Config{Job: "sim", Rank: 2})
	long := `{"op":"event","kind":"k","message":"` + strings.Repeat("x", rankv1.MaxLine) + `"}` + "\n"
	tests := []struct {
		name, line, code string
	}{
		{"not json", "hello\n", rankv1.CodeBadRequest},
		{"no op", "{}\n", rankv1.CodeBadRequest},
		{"unknown op", `{"op":"reboot"}` + "\n", rankv1.CodeBadRequest},
		{"longer than 64 KiB", long, rankv1.CodeBadRequest},
		{"ready outside a watch", `{"op":"ready"}` + "\n", rankv1.CodeBadRequest},
		{"another job", `{"op":"info","job":"other"}` + "\n", rankv1.CodeForbidden},
		{"another rank", `{"op":"checkpoint","rank":1}` + "\n", rankv1.CodeForbidden},
		{"unknown ticket", `{"op":"result","ticket":"sim.2-000000"}` + "\n", rankv1.CodeNotFound},
		{"result without a ticket", `{"op":"result"}` + "\n", rankv1.CodeBadRequest},
		{"bad kind", `{"op":"event","kind":"a b"}` + "\n", rankv1.CodeBadRequest},
		{"kind too long", `{"op":"event","kind":"` + strings.Repeat("k", 33) + `"}` + "\n", rankv1.CodeBadRequest},
		{"message too long", `{"op":"event","kind":"k","message":"` + strings.Repeat("m", 1025) + `"}` + "\n", rankv1.CodeBadRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := exchange(t, s, tc.line)
			if r.OK || r.Code != tc.code || r.Error == "" {
				t.Errorf("reply %+v; want code %s with a message", r, tc.code)
			}
		})
	}
	r := exchange(t, s, `{"op":"info","job":"sim","rank":2}`+"\n")
	if !r.OK || r.Job != "sim" || r.Rank == nil || *r.Rank != 2 || r.Incarnation != 1 {
		t.Errorf("info naming its own job and rank: %+v", r)
	}
	if len(s.Events()) != 0 || len(s.Trace()) != 0 {
		t.Errorf("refused requests left events %v, trace %v", s.Events(), s.Trace())
	}
}

// TestRankFakeRound: a checkpoint's ticket is pending, the socket goes
// away while the rank is frozen, and the ticket is done once it is back.
func TestRankFakeRound(t *testing.T) {
	s := newServer(t, ranktest.Config{Ckpt: 3, Pending: 300 * time.Millisecond, Frozen: 300 * time.Millisecond})
	r := exchange(t, s, `{"op":"checkpoint"}`+"\n")
	if !r.OK || r.Ticket == "" {
		t.Fatalf("checkpoint: %+v", r)
	}
	result := `{"op":"result","ticket":"` + r.Ticket + `"}` + "\n"
	if r := exchange(t, s, result); !r.OK || r.State != rankv1.StatePending {
		t.Fatalf("result while pending: %+v", r)
	}
	away := false
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		_, err := os.Stat(s.Path())
		if os.IsNotExist(err) {
			away = true
		} else if away {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !away {
		t.Fatal("the socket never went away")
	}
	// The socket's file is there once bound, a moment before it listens.
	for {
		conn, err := net.Dial("unix", s.Path())
		if err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the socket came back but takes no connection: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for time.Now().Before(deadline) {
		if r := exchange(t, s, result); r.State != rankv1.StatePending {
			if !r.OK || r.State != rankv1.StateDone || r.Ckpt != 4 {
				t.Fatalf("result: %+v; want done 4", r)
			}
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, want := strings.Join(s.Trace(), ","), "checkpoint,round 4,freeze,commit 4,thaw"; got != want {
		t.Errorf("trace %s, want %s", got, want)
	}
}

// TestRankFakeNoSocketAfterClose: Close removes the socket.
func TestRankFakeNoSocketAfterClose(t *testing.T) {
	dir := t.TempDir()
	s, err := ranktest.Start(ranktest.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "rank.sock")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(dir, "rank.sock")); !os.IsNotExist(err) {
		t.Fatalf("socket after Close: %v", err)
	}
}
