package container_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// What databases, HDF5, sqlite and MPI runtimes leave in a rank: path
// sockets, file locks, large unlinked files in /dev/shm. Each must survive
// checkpoint, kill and restore.

// runPython runs a python3 program as a container's init (the container's
// lower layer is the host's /, so the host's python3 is there).
func runPython(t *testing.T, env *testutil.Env, name, program string) *container.Info {
	t.Helper()
	in, err := env.Manager.Run(context.Background(), container.Config{Name: name, Args: []string{"python3", "-c", program}})
	if err != nil {
		t.Fatalf("run %s: %v", name, err)
	}
	return in
}

// execPython runs a python3 program with arguments in a running container
// (a process of its own, not of init's tree) and returns its output.
func execPython(t *testing.T, m *container.Manager, name, program string, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	code, err := m.Exec(context.Background(), name, append([]string{"python3", "-c", program}, args...), nil, &out, &errb)
	if err != nil || code != 0 {
		t.Fatalf("exec in %s: exit %d, %v (%s)", name, code, err, errb.String())
	}
	return strings.TrimSpace(out.String())
}

// waitFor polls cond until it holds or 30 seconds have passed.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, got := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last: %s", what, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// counter reads a number a container's program keeps writing into a file
// of its root; -1 if there is none yet.
func counter(in *container.Info, name string) int {
	b, err := os.ReadFile(filepath.Join(in.RootFS, name))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.Fields(string(b) + " x")[0])
	if err != nil {
		return -1
	}
	return n
}

// waitCounter waits until the counter in file name goes past after, which
// shows the program runs.
func waitCounter(t *testing.T, m *container.Manager, container, name string, after int) int {
	t.Helper()
	in, err := m.Get(context.Background(), container)
	if err != nil {
		t.Fatal(err)
	}
	n := -1
	waitFor(t, container+" to count past "+strconv.Itoa(after), func() (bool, string) {
		n = counter(in, name)
		return n > after, strconv.Itoa(n)
	})
	return n
}

func killContainer(t *testing.T, m *container.Manager, name string) {
	t.Helper()
	ctx := context.Background()
	if err := m.Kill(ctx, name, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, name+" to exit", func() (bool, string) {
		in, err := m.Get(ctx, name)
		if err != nil {
			return false, err.Error()
		}
		return in.Status == container.StatusExited, string(in.Status)
	})
}

// sockServer listens on two path sockets in the container's own files, one
// in a directory of the lower layer (/tmp) and one in a directory it made,
// and answers every connection with how many it has served on that
// socket. Before that, a server that has exited left its socket file in
// /tmp/stale.sock.
const sockServer = `
import os, selectors, socket
s = socket.socket(socket.AF_UNIX)
s.bind("/tmp/stale.sock")
s.close()
os.makedirs("/var/lib/app", exist_ok=True)
sel = selectors.DefaultSelector()
for p in ("/tmp/app.sock", "/var/lib/app/app.sock"):
    l = socket.socket(socket.AF_UNIX)
    l.bind(p)
    l.listen(8)
    sel.register(l, selectors.EVENT_READ, [p, 0])
while True:
    for key, _ in sel.select():
        c, _ = key.fileobj.accept()
        key.data[1] += 1
        c.sendall(("%s served %d" % (key.data[0], key.data[1])).encode())
        c.close()
`

// sockClient prints what kind of file its argument is and what a
// connection to it gets: the server's answer or the error.
const sockClient = `
import os, socket, stat, sys
p = sys.argv[1]
try:
    kind = "socket" if stat.S_ISSOCK(os.lstat(p).st_mode) else "not a socket"
except OSError as e:
    kind = type(e).__name__
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(p)
    print(kind, s.recv(100).decode())
except OSError as e:
    print(kind, type(e).__name__)
`

// TestUnixSocketsRestored: a server listening on path sockets in the
// container's written files is checkpointed, killed and restored (and
// restored again as a copy beside it); clients in the container reach it
// on the same paths and it goes on counting from the checkpoint. The
// socket file of a server that had exited comes back as it was: a socket
// file nobody listens on.
func TestUnixSocketsRestored(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	runPython(t, env, "c", sockServer)
	const tmpSock, libSock, stale = "/tmp/app.sock", "/var/lib/app/app.sock", "/tmp/stale.sock"
	ask := func(name, p string) string { return execPython(t, m, name, sockClient, p) }
	waitFor(t, "the server", func() (bool, string) {
		got := ask("c", libSock)
		return got == "socket "+libSock+" served 1", got
	})
	for _, c := range []struct{ name, path, want string }{
		{"c", tmpSock, "socket " + tmpSock + " served 1"},
		{"c", tmpSock, "socket " + tmpSock + " served 2"},
		{"c", stale, "socket ConnectionRefusedError"},
	} {
		if got := ask(c.name, c.path); got != c.want {
			t.Fatalf("before the checkpoint, %s in %s: %q, want %q", c.path, c.name, got, c.want)
		}
	}
	if _, err := m.Checkpoint(ctx, "c", container.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	// Served after the checkpoint: forgotten by the restore.
	if got, want := ask("c", tmpSock), "socket "+tmpSock+" served 3"; got != want {
		t.Fatalf("after the checkpoint: %q, want %q", got, want)
	}
	killContainer(t, m, "c")
	if _, err := m.Restore(ctx, "c", container.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Restore(ctx, "c", container.RestoreOptions{Seq: 1, As: "c2"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, path, want string }{
		{"c", tmpSock, "socket " + tmpSock + " served 3"},
		{"c", libSock, "socket " + libSock + " served 2"},
		{"c", stale, "socket ConnectionRefusedError"},
		{"c2", tmpSock, "socket " + tmpSock + " served 3"},
		{"c2", tmpSock, "socket " + tmpSock + " served 4"},
		{"c", tmpSock, "socket " + tmpSock + " served 4"},
		{"c2", libSock, "socket " + libSock + " served 2"},
		{"c2", stale, "socket ConnectionRefusedError"},
	} {
		if got := ask(c.name, c.path); got != c.want {
			t.Errorf("after restore, %s in %s: %q, want %q", c.path, c.name, got, c.want)
		}
	}
}

// lockHolder takes a flock, a POSIX (fcntl) lock and an OFD lock on three
// files of its own and counts in /root/locks/beat while it holds them.
const lockHolder = `
import fcntl, os, struct, time
os.makedirs("/root/locks", exist_ok=True)
a = open("/root/locks/flock", "w")
fcntl.flock(a, fcntl.LOCK_EX)
b = open("/root/locks/posix", "w")
fcntl.lockf(b, fcntl.LOCK_EX)
c = open("/root/locks/ofd", "w")
fcntl.fcntl(c, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
open("/root/locks/free", "w").close()
n = 0
while True:
    n += 1
    with open("/root/locks/beat.tmp", "w") as f:
        f.write(str(n))
    os.rename("/root/locks/beat.tmp", "/root/locks/beat")
    time.sleep(0.05)
`

// lockProbe tries, without waiting, the lock of each kind on its file and
// prints what it got: "free", or the errno's name.
const lockProbe = `
import errno, fcntl, struct
def try_lock(kind, path):
    f = open(path, "r+")
    try:
        if kind == "flock":
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        elif kind == "posix":
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            fcntl.fcntl(f, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
        return "free"
    except OSError as e:
        return errno.errorcode[e.errno]
print(" ".join(try_lock(k, "/root/locks/" + p) for k, p in
    [("flock", "flock"), ("posix", "posix"), ("ofd", "ofd"), ("flock", "free"), ("posix", "free"), ("ofd", "free")]))
`

// TestFileLocksRestored: a process holding a flock, a POSIX lock and an
// OFD lock on files it wrote is checkpointed, killed and restored: it
// holds the three locks again (another process of the container cannot
// take them) and goes on running.
func TestFileLocksRestored(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	runPython(t, env, "c", lockHolder)
	const held = "EAGAIN EAGAIN EAGAIN free free free"
	n := waitCounter(t, m, "c", "root/locks/beat", 0)
	if got := execPython(t, m, "c", lockProbe); got != held {
		t.Fatalf("locks before the checkpoint: %q, want %q", got, held)
	}
	if _, err := m.Checkpoint(ctx, "c", container.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCounter(t, m, "c", "root/locks/beat", n)
	killContainer(t, m, "c")
	in, err := m.Restore(ctx, "c", container.RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := execPython(t, m, "c", lockProbe); got != held {
		t.Errorf("locks after restore: %q, want %q", got, held)
	}
	at := counter(in, "root/locks/beat")
	waitCounter(t, m, "c", "root/locks/beat", at+5)
	if got := execPython(t, m, "c", lockProbe); got != held {
		t.Errorf("locks after restore, later: %q, want %q", got, held)
	}
}

// ghostHolder keeps an 8 MiB file of /dev/shm open after unlinking it
// (what UCX does under MPICH), writes the data's hash to /root/want, and
// keeps reading the file back through its descriptor, writing a count and
// the hash of what it read to /root/got.
const ghostHolder = `
import hashlib, os, time
data = os.urandom(8 << 20)
fd = os.open("/dev/shm/ghost", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
view = memoryview(data)
while view:
    view = view[os.write(fd, view):]
os.unlink("/dev/shm/ghost")
with open("/root/want", "w") as f:
    f.write(hashlib.sha256(data).hexdigest())
del data, view
n = 0
while True:
    n += 1
    got = hashlib.sha256(os.pread(fd, 9 << 20, 0)).hexdigest()
    with open("/root/got.tmp", "w") as f:
        f.write("%d %s" % (n, got))
    os.rename("/root/got.tmp", "/root/got")
    time.sleep(0.1)
`

// TestUnlinkedShmFileRestored: a process holding an unlinked 8 MiB file
// of /dev/shm open (above CRIU's default limit of 1 MiB for such "ghost"
// files) is checkpointed, killed and restored, and reads the same bytes
// back from its descriptor; the file stays unlinked.
func TestUnlinkedShmFileRestored(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	in := runPython(t, env, "c", ghostHolder)
	if shm, limit := shmSize(t, in), ghostLimit(t, in); shm != limit || shm < 8<<20 {
		t.Errorf("/dev/shm holds %d bytes, CRIU's ghost limit is %d: want them equal", shm, limit)
	}
	n := waitCounter(t, m, "c", "root/got", 0)
	want, err := os.ReadFile(filepath.Join(in.RootFS, "root/want"))
	if err != nil || len(want) != 64 {
		t.Fatalf("/root/want: %q, %v", want, err)
	}
	got := func() string {
		b, _ := os.ReadFile(filepath.Join(in.RootFS, "root/got"))
		f := strings.Fields(string(b))
		if len(f) != 2 {
			return ""
		}
		return f[1]
	}
	if g := got(); g != string(want) {
		t.Fatalf("before the checkpoint the process reads %q, wrote %q", g, want)
	}
	if _, err := m.Checkpoint(ctx, "c", container.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCounter(t, m, "c", "root/got", n)
	killContainer(t, m, "c")
	if in, err = m.Restore(ctx, "c", container.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	at := counter(in, "root/got")
	waitCounter(t, m, "c", "root/got", at+2)
	if g := got(); g != string(want) {
		t.Errorf("after restore the process reads %q, wrote %q", g, want)
	}
	if out := execPython(t, m, "c", `import os; print(sorted(os.listdir("/dev/shm")))`); out != "[]" {
		t.Errorf("/dev/shm after restore holds %s, want the file still unlinked", out)
	}
}

// inotifyHolder watches (inotify) a file it wrote in /root/w, the lower
// layer's /tmp, and /data, a directory it made after the container
// started, and counts the events of each watch in /root/events.
const inotifyHolder = `
import ctypes, os, select, struct
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("/root/w", exist_ok=True)
os.makedirs("/data", exist_ok=True)
open("/root/w/f", "w").close()
fd = libc.inotify_init1(0)
IN_MODIFY, IN_ATTRIB, IN_CREATE = 0x2, 0x4, 0x100
wds = {}
for i, p in enumerate(["/root/w/f", "/tmp", "/data"]):
    wd = libc.inotify_add_watch(fd, p.encode(), IN_MODIFY | IN_ATTRIB | IN_CREATE)
    if wd < 0:
        raise OSError(ctypes.get_errno(), p)
    wds[wd] = i
counts = [0, 0, 0]
beat = 0
while True:
    beat += 1
    if select.select([fd], [], [], 0.05)[0]:
        buf = os.read(fd, 65536)
        off = 0
        while off < len(buf):
            wd, mask, cookie, n = struct.unpack_from("iIII", buf, off)
            counts[wds[wd]] += 1
            off += 16 + n
    with open("/root/events.tmp", "w") as f:
        f.write("%d %d %d %d" % (beat, counts[0], counts[1], counts[2]))
    os.rename("/root/events.tmp", "/root/events")
`

// TestInotifyWatchesRestored: a process watching (inotify) files and
// directories of the container's overlay root is checkpointed, killed and
// restored, and its watches report changes made after the restore.
func TestInotifyWatchesRestored(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	in := runPython(t, env, "c", inotifyHolder)
	events := func() []int {
		b, _ := os.ReadFile(filepath.Join(in.RootFS, "root/events"))
		var n []int
		for _, f := range strings.Fields(string(b)) {
			i, _ := strconv.Atoi(f)
			n = append(n, i)
		}
		if len(n) != 4 {
			return []int{-1, -1, -1, -1}
		}
		return n
	}
	waitCounter(t, m, "c", "root/events", 0)
	rec, err := m.Checkpoint(ctx, "c", container.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// CRIU walked the root's directories for the watched files.
	t.Logf("stall %v", rec.Timing.Stall)
	killContainer(t, m, "c")
	if in, err = m.Restore(ctx, "c", container.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	at := events()
	if at[0] < 0 {
		t.Fatalf("no event counts after restore")
	}
	var out, errb bytes.Buffer
	if code, err := m.Exec(ctx, "c", []string{"sh", "-c", "echo x >> /root/w/f; touch /tmp/new /data/new"}, nil, &out, &errb); err != nil || code != 0 {
		t.Fatalf("change the watched files: exit %d, %v (%s)", code, err, errb.String())
	}
	waitFor(t, "an event on each watch", func() (bool, string) {
		now := events()
		return now[0] > at[0] && now[1] > at[1] && now[2] > at[2] && now[3] > at[3], fmt.Sprint(at, " -> ", now)
	})
}

// TestCheckpointRefusesUnreachableWatch: a watch on a file no path leads
// to any more (deleted while still open) cannot be dumped; the checkpoint
// fails saying what to do, and the container keeps running.
func TestCheckpointRefusesUnreachableWatch(t *testing.T) {
	env := testutil.NewEnv(t)
	ctx := context.Background()
	m := env.Manager
	runPython(t, env, "c", `
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
f = open("/root/gone", "w")
fd = libc.inotify_init1(0)
if libc.inotify_add_watch(fd, b"/root/gone", 0x2) < 0:
    raise OSError(ctypes.get_errno(), "watch")
os.unlink("/root/gone")
n = 0
while True:
    n += 1
    with open("/root/beat", "w") as b:
        b.write(str(n))
    time.sleep(0.05)
`)
	n := waitCounter(t, m, "c", "root/beat", 0)
	_, err := m.Checkpoint(ctx, "c", container.CheckpointOptions{})
	if !errors.Is(err, container.ErrDumpFailed) || !strings.Contains(err.Error(), "remove the watch") {
		t.Fatalf("checkpoint of a watch on a deleted file: %v, want ErrDumpFailed saying what to do", err)
	}
	t.Logf("error as users see it: %v", err)
	expectRunningNoCheckpoint(t, env, "c")
	waitCounter(t, m, "c", "root/beat", n+5)
}

// shmSize is the size of the container's /dev/shm tmpfs, from its runc
// spec.
func shmSize(t *testing.T, in *container.Info) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(in.Dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Mounts []struct {
			Destination string   `json:"destination"`
			Options     []string `json:"options"`
		} `json:"mounts"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	for _, mt := range spec.Mounts {
		for _, o := range mt.Options {
			if v, ok := strings.CutPrefix(o, "size="); ok && mt.Destination == "/dev/shm" {
				k, err := strconv.ParseInt(strings.TrimSuffix(v, "k"), 10, 64)
				if err != nil || !strings.HasSuffix(v, "k") {
					t.Fatalf("/dev/shm size %q", v)
				}
				return k << 10
			}
		}
	}
	t.Fatal("no /dev/shm mount with a size in the spec")
	return 0
}

// ghostLimit is the ghost-limit of the container's CRIU config file.
func ghostLimit(t *testing.T, in *container.Info) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(in.Dir, "criu.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "ghost-limit "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("criu.conf: %q", l)
			}
			return n
		}
	}
	return 1 << 20 // CRIU's default
}
