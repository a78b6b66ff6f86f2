package ringapp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
)

// stream builds the bytes a rank sends downstream.
type stream struct {
	payload int
	sender  int
	b       bytes.Buffer
}

// msg appends message seq; edit, if set, changes it before it is appended.
func (s *stream) msg(seq uint64, edit func([]byte)) *stream {
	buf := make([]byte, messageSize(s.payload))
	encode(buf, seq, seq*10, s.sender)
	if edit != nil {
		edit(buf)
	}
	s.b.Write(buf)
	return s
}

// reseal recomputes the checksum of an edited message.
func reseal(b []byte) {
	end := len(b) - crcSize
	binary.LittleEndian.PutUint32(b[end:], crc32.Checksum(b[:end], castagnoli))
}

func TestReceiver(t *testing.T) {
	const payload = 100
	flip := func(off int) func([]byte) { return func(b []byte) { b[off] ^= 0x10 } }
	tests := []struct {
		name  string
		seqs  []uint64
		edits map[int]func([]byte) // by index in seqs
		cut   int                  // bytes cut off the end of the stream
		want  error                // from receive, after the messages that are fine
		ok    int                  // messages received before the error
		end   error                // from expectEnd, if all messages were fine
	}{
		{name: "good", seqs: []uint64{0, 1, 2, 3}, ok: 4},
		{name: "duplicate", seqs: []uint64{0, 1, 1, 2}, want: ErrDuplicate, ok: 2},
		{name: "duplicate earlier", seqs: []uint64{0, 1, 2, 0}, want: ErrDuplicate, ok: 3},
		{name: "lost", seqs: []uint64{0, 1, 3}, want: ErrLost, ok: 2},
		{name: "reordered", seqs: []uint64{0, 2, 1}, want: ErrLost, ok: 1},
		{name: "lost first", seqs: []uint64{1, 2}, want: ErrLost},
		{name: "truncated", seqs: []uint64{0, 1}, cut: 7, want: ErrLost, ok: 1},
		{name: "ended early", seqs: []uint64{0, 1}, want: ErrLost, ok: 2},
		{name: "payload bit", seqs: []uint64{0, 1, 2}, edits: map[int]func([]byte){1: flip(headerSize + 50)}, want: ErrCorrupt, ok: 1},
		{name: "seq bit", seqs: []uint64{0, 1, 2}, edits: map[int]func([]byte){2: flip(0)}, want: ErrCorrupt, ok: 2},
		{name: "value bit", seqs: []uint64{0, 1}, edits: map[int]func([]byte){0: flip(9)}, want: ErrCorrupt},
		{name: "checksum bit", seqs: []uint64{0, 1}, edits: map[int]func([]byte){1: flip(messageSize(payload) - 1)}, want: ErrCorrupt, ok: 1},
		{name: "payload resealed", seqs: []uint64{0, 1}, edits: map[int]func([]byte){1: func(b []byte) {
			b[headerSize+payload-1]++
			reseal(b)
		}}, want: ErrCorrupt, ok: 1},
		{name: "payload of another message", seqs: []uint64{0, 1}, edits: map[int]func([]byte){1: func(b []byte) {
			fillPayload(b[headerSize:headerSize+payload], 0, 1)
			reseal(b)
		}}, want: ErrCorrupt, ok: 1},
		{name: "wrong sender", seqs: []uint64{0}, edits: map[int]func([]byte){0: func(b []byte) {
			binary.LittleEndian.PutUint32(b[16:], 2)
			reseal(b)
		}}, want: ErrCorrupt},
		{name: "wrong length", seqs: []uint64{0}, edits: map[int]func([]byte){0: func(b []byte) {
			binary.LittleEndian.PutUint32(b[20:], payload+8)
			reseal(b)
		}}, want: ErrCorrupt},
		{name: "data after the last", seqs: []uint64{0, 1, 2, 2}, ok: 3, end: ErrDuplicate},
		{name: "bytes after the last", seqs: []uint64{0, 1, 2, 3}, cut: messageSize(payload) - 5, ok: 3, end: ErrDuplicate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &stream{payload: payload, sender: 1}
			for i, seq := range tc.seqs {
				s.msg(seq, tc.edits[i])
			}
			b := s.b.Bytes()[:s.b.Len()-tc.cut]
			rc := newReceiver(bufio.NewReader(bytes.NewReader(b)), 1, payload)
			var err error
			n := 0
			want := tc.ok
			if tc.want != nil {
				want = tc.ok + 1 // receive until the error
			}
			for ; n < want; n++ {
				var v uint64
				if v, err = rc.receive(); err != nil {
					break
				}
				if v != uint64(n)*10 {
					t.Fatalf("message %d: value %d, want %d", n, v, n*10)
				}
			}
			if n != tc.ok {
				t.Errorf("received %d messages, want %d (err %v)", n, tc.ok, err)
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("receive: %v, want %v", err, tc.want)
			}
			if err != nil {
				t.Logf("error: %v", err)
				word := map[error]string{ErrCorrupt: "corrupt", ErrLost: "lost", ErrDuplicate: "duplicate"}[tc.want]
				if !strings.Contains(err.Error(), word) {
					t.Errorf("error %q does not say %q", err, word)
				}
				return
			}
			if err := rc.expectEnd(); !errors.Is(err, tc.end) {
				t.Fatalf("expectEnd: %v, want %v", err, tc.end)
			} else if err != nil {
				t.Logf("end: %v", err)
			}
		})
	}
}

func TestPayload(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 13, 4096} {
		p := make([]byte, n)
		fillPayload(p, 42, 3)
		if off := checkPayload(p, 42, 3); off != -1 {
			t.Fatalf("payload %d: differs at %d from itself", n, off)
		}
		for _, off := range []int{0, n / 2, n - 1} {
			if n == 0 {
				break
			}
			q := bytes.Clone(p)
			q[off] ^= 1
			if got := checkPayload(q, 42, 3); got != off {
				t.Errorf("payload %d, byte %d changed: checkPayload says %d", n, off, got)
			}
		}
		if n >= 8 {
			if checkPayload(p, 43, 3) == -1 || checkPayload(p, 42, 2) == -1 {
				t.Errorf("payload %d does not depend on seq and sender", n)
			}
		}
	}
}

// FuzzReceive feeds arbitrary bytes to a receiver: it must not panic, and
// must accept only what a correct sender would have sent.
func FuzzReceive(f *testing.F) {
	const payload = 16
	s := &stream{payload: payload, sender: 1}
	f.Add(s.msg(0, nil).msg(1, nil).b.Bytes())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		rc := newReceiver(bufio.NewReader(bytes.NewReader(b)), 1, payload)
		for n := uint64(0); ; n++ {
			v, err := rc.receive()
			if err != nil {
				break
			}
			// Any value may travel; the rest of the message must be
			// exactly what a sender produces for it.
			want := make([]byte, messageSize(payload))
			encode(want, n, v, 1)
			if got := b[int(n)*len(want) : int(n+1)*len(want)]; !bytes.Equal(got, want) {
				t.Fatalf("accepted message %d that a sender would not send", n)
			}
		}
		_ = rc.expectEnd()
	})
}

func TestHello(t *testing.T) {
	cfg := &Config{Job: "j", Rank: 2, Size: 5, Messages: 1000, Window: 8, Payload: 12}
	h := newHello(cfg)
	got, err := unmarshalHello(h.marshal())
	if err != nil {
		t.Fatal(err)
	}
	if got != h {
		t.Errorf("round trip: got %v, want %v", got, h)
	}
	if _, err := unmarshalHello(make([]byte, helloSize)); !errors.Is(err, errNotHello) {
		t.Errorf("zeros: %v, want errNotHello", err)
	}
	cfg.Job = "k"
	if newHello(cfg) == h {
		t.Error("hello does not depend on the job name")
	}
}

func TestParseArgs(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	tests := []struct {
		name    string
		args    []string
		env     func(string) string
		rank    int
		addrs   []string
		job     string
		socket  string // rank 0's progress reports go there
		wantErr bool
	}{
		{
			name:  "environment",
			env:   env("CAIRN_RANK", "1", "CAIRN_SIZE", "3", "CAIRN_JOB", "j1", "CAIRN_PEERS", "10.0.0.2,10.0.0.3,10.0.1.2"),
			rank:  1,
			addrs: []string{"10.0.0.2:7171", "10.0.0.3:7171", "10.0.1.2:7171"},
			job:   "j1",
		},
		{
			name:   "flags override",
			args:   []string{"-rank", "0", "-peers", "10.0.0.7,10.0.0.8", "-port", "9000", "-job", "x"},
			env:    env("CAIRN_RANK", "1", "CAIRN_SIZE", "2", "CAIRN_JOB", "j1", "CAIRN_PEERS", "10.0.0.2,10.0.0.3"),
			rank:   0,
			addrs:  []string{"10.0.0.7:9000", "10.0.0.8:9000"},
			job:    "x",
			socket: rankv1.SocketPath,
		},
		{
			name:   "the rank API's socket from the environment",
			env:    env("CAIRN_RANK", "0", "CAIRN_SIZE", "1", "CAIRN_SOCKET", "/x/rank.sock"),
			addrs:  []string{"127.0.0.1:7171"},
			socket: "/x/rank.sock",
		},
		{
			name:  "no progress reports",
			args:  []string{"-report=false"},
			env:   env("CAIRN_RANK", "0", "CAIRN_SIZE", "1", "CAIRN_JOB", "j1"),
			addrs: []string{"127.0.0.1:7171"},
			job:   "j1",
		},
		{
			name:  "localhost",
			args:  []string{"-rank", "2", "-size", "3", "-port-base", "20000"},
			env:   env(),
			rank:  2,
			addrs: []string{"127.0.0.1:20000", "127.0.0.1:20001", "127.0.0.1:20002"},
		},
		{
			name:  "repeated peers",
			args:  []string{"-peers", "10.0.0.2,10.0.0.2,10.0.0.3"},
			env:   env("CAIRN_RANK", "0"),
			addrs: []string{"10.0.0.2:7171", "10.0.0.2:7172", "10.0.0.3:7173"},
		},
		{
			name:  "a job too large for CAIRN_PEERS",
			env:   env("CAIRN_RANK", "1", "CAIRN_SIZE", "3", "CAIRN_SUBNET", "10.224.8.0/22"),
			rank:  1,
			addrs: []string{"10.224.8.2:7171", "10.224.8.3:7171", "10.224.8.4:7171"},
		},
		{name: "no rank", args: []string{"-size", "2"}, env: env(), wantErr: true},
		{name: "rank too big", args: []string{"-size", "2", "-rank", "2"}, env: env(), wantErr: true},
		{name: "peers and size differ", args: []string{"-size", "3", "-peers", "a,b"}, env: env("CAIRN_RANK", "0"), wantErr: true},
		{name: "bad env", env: env("CAIRN_RANK", "x", "CAIRN_SIZE", "2"), wantErr: true},
		{name: "no window", args: []string{"-size", "1", "-rank", "0", "-window", "0"}, env: env(), wantErr: true},
		{name: "hold past the end", args: []string{"-size", "1", "-rank", "0", "-messages", "10", "-hold", "10"}, env: env(), wantErr: true},
		{name: "arguments", args: []string{"-size", "1", "-rank", "0", "extra"}, env: env(), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseArgs(tc.args, tc.env, io.Discard)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("no error; config %+v", cfg)
				}
				t.Logf("error: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Rank != tc.rank || cfg.Job != tc.job || cfg.Size != len(tc.addrs) || cfg.Socket != tc.socket {
				t.Errorf("rank %d size %d job %q socket %q, want %d %d %q %q", cfg.Rank, cfg.Size, cfg.Job, cfg.Socket, tc.rank, len(tc.addrs), tc.job, tc.socket)
			}
			if diff := cmp.Diff(tc.addrs, cfg.Addrs); diff != "" {
				t.Errorf("addrs (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRunDetects runs a real rank 1 of 2 whose upstream (the test, posing as
// rank 0) sends a crafted stream: the rank must fail with the right error.
func TestRunDetects(t *testing.T) {
	const payload, messages = 64, 10
	tests := []struct {
		name string
		seqs []uint64
		edit func(int, []byte)
		want error
	}{
		{name: "duplicate", seqs: []uint64{0, 1, 2, 2, 3}, want: ErrDuplicate},
		{name: "lost", seqs: []uint64{0, 1, 3, 4}, want: ErrLost},
		{name: "corrupt", seqs: []uint64{0, 1, 2}, edit: func(i int, b []byte) {
			if i == 2 {
				b[headerSize] ^= 1
			}
		}, want: ErrCorrupt},
		{name: "closed early", seqs: []uint64{0, 1, 2}, want: ErrLost},
		{name: "one too many", seqs: []uint64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9}, want: ErrDuplicate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ln0 := listen(t)
			ln1 := listen(t)
			cfg := Config{
				Job: "detect", Rank: 1, Size: 2, Addrs: []string{ln0.Addr().String(), ln1.Addr().String()},
				Messages: messages, Window: 4, Payload: payload, ConnectTimeout: 10 * time.Second, Listener: ln1,
			}
			// Take what rank 1 forwards, confirm once all of it came.
			go func() {
				c, err := ln0.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				if _, err := io.ReadFull(c, make([]byte, helloSize+messages*messageSize(payload))); err != nil {
					return
				}
				c.Write(marshalDone(messages))
				io.Copy(io.Discard, c)
			}()
			go func() {
				c, err := net.Dial("tcp", ln1.Addr().String())
				if err != nil {
					return
				}
				defer c.Close()
				h := newHello(&cfg)
				h.rank = 0
				c.Write(h.marshal())
				buf := make([]byte, messageSize(payload))
				for i, seq := range tc.seqs {
					encode(buf, seq, seq, 0)
					if tc.edit != nil {
						tc.edit(i, buf)
					}
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
				if len(tc.seqs) > messages {
					// Let rank 1 confirm, then see the extra message.
					io.ReadFull(c, make([]byte, doneSize))
				}
			}()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			_, err := Run(ctx, cfg)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Run: %v, want %v", err, tc.want)
			}
			t.Logf("Run: %v", err)
		})
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}
