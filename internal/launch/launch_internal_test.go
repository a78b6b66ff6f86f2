package launch

import (
	"bytes"
	"encoding/hex"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The daemon runs in a child process (it reaps every child of its
// process, as a container's init does): TestMain runs it when the test
// binary is started with daemonRole set.
const daemonRole = "CAIRN_LAUNCH_TEST_DAEMON"

func TestMain(m *testing.M) {
	if os.Getenv(daemonRole) != "" {
		idleExit = 500 * time.Millisecond
		cfg, err := ConfigFromEnv(MPICH, []string{"true"})
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(2)
		}
		cfg.Hosts = ""
		os.Exit(Run(cfg))
	}
	os.Exit(m.Run())
}

// startDaemon starts a launch daemon for rank 1 of a job whose ranks are
// 127.0.0.2 (rank 0) and 127.0.0.1 (rank 1, the daemon), and returns its
// port and a channel with its exit code.
func startDaemon(t *testing.T, secret []byte) (int, <-chan int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), daemonRole+"=1",
		"CAIRN_JOB=j", "CAIRN_RANK=1", "CAIRN_PEERS=127.0.0.2,127.0.0.1",
		EnvSubnet+"=127.0.0.0/8", EnvSecret+"="+hex.EncodeToString(secret),
		EnvPort+"="+strconv.Itoa(port), EnvTools+"=/nonexistent")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() {
		err := cmd.Wait()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		done <- code
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("daemon's output:\n%s", stderr.String())
		}
	})
	// Wait until it listens.
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
			c.Close()
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the daemon does not listen: %s", stderr.String())
		}
	}
	return port, done
}

func rshEnv(t *testing.T, secret []byte, port int) {
	t.Setenv(EnvSecret, hex.EncodeToString(secret))
	t.Setenv(EnvPort, strconv.Itoa(port))
	t.Setenv(EnvMPI, OpenMPI) // an MPICH agent would signal its parent: this test
}

// TestRshRunsCommands: an agent runs a command in a peer's daemon as ssh
// would (the words joined, through sh -c), with its stdin, stdout, stderr
// and exit status; a command the agent is interrupted in is signalled; a
// wrong secret and an address outside the job are refused; a quit ends the
// daemon, which then exits 0.
func TestRshRunsCommands(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	port, done := startDaemon(t, secret)
	rshEnv(t, secret, port)

	var out, errb bytes.Buffer
	code := Rsh([]string{"127.0.0.1", "echo", "out;", "echo err >&2;", "tr a-z A-Z;", "exit 3"}, strings.NewReader("stdin\n"), &out, &errb)
	if code != 3 || out.String() != "out\nSTDIN\n" || errb.String() != "err\n" {
		t.Fatalf("rsh: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	out.Reset()
	errb.Reset()
	if code := Rsh([]string{"127.0.0.1", "kill -TERM $$"}, strings.NewReader(""), &out, &errb); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("a command killed by SIGTERM: exit %d, want %d (%s)", code, 128+int(syscall.SIGTERM), errb.String())
	}

	// Wrong secret: refused, and the agent says so.
	dialTimeout = time.Second
	t.Setenv(EnvSecret, hex.EncodeToString([]byte("another secret of 32 bytes......")))
	errb.Reset()
	if code := Rsh([]string{"127.0.0.1", "true"}, strings.NewReader(""), &out, &errb); code != 255 || !strings.Contains(errb.String(), "secret") {
		t.Fatalf("wrong secret: exit %d, %q", code, errb.String())
	}
	// From an address that is no rank of the job: refused before the
	// challenge.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}}
	nc, err := d.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, _ := nc.Read(make([]byte, NonceSize)); n != 0 {
		t.Fatalf("a connection from outside the job got %d bytes of challenge", n)
	}
	nc.Close()

	c, err := dial(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), secret, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.send(frameQuit, code32(0)); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("daemon exited %d after quit", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon did not exit after quit")
	}
}

// TestDaemonExitsWhenIdle: a daemon whose commands have all ended and that
// gets no new one (its rank 0 is gone without a quit) exits by itself
// with the last command's status.
func TestDaemonExitsWhenIdle(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	port, done := startDaemon(t, secret)
	rshEnv(t, secret, port)
	var out bytes.Buffer
	if code := Rsh([]string{"127.0.0.1", "exit 0"}, strings.NewReader(""), &out, &out); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("idle daemon exited %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an idle daemon did not exit")
	}
}

// TestLauncher pins the launch command lines (docs/mpi.md explains each
// setting).
func TestLauncher(t *testing.T) {
	peers := []netip.Addr{netip.MustParseAddr("10.9.0.2"), netip.MustParseAddr("10.9.0.3")}
	subnet := netip.MustParsePrefix("10.9.0.0/24")
	argv, env := launcher(OpenMPI, peers, subnet, "eth0", "/.cairn", []string{"prog", "-x"})
	want := "/usr/bin/mpirun.openmpi --allow-run-as-root -np 2 -H 10.9.0.2:1,10.9.0.3:1 --bind-to none " +
		"--mca plm_rsh_agent /.cairn/cairn rsh --mca oob_tcp_if_include 10.9.0.0/24 --mca btl_tcp_if_include 10.9.0.0/24 " +
		"--mca btl self,tcp --mca pml ob1 prog -x"
	if got := strings.Join(argv, " "); got != want || len(env) != 0 {
		t.Errorf("openmpi:\n got %s %v\nwant %s", got, env, want)
	}
	argv, env = launcher(MPICH, peers, subnet, "eth0", "/nonexistent", []string{"prog"})
	want = "/usr/bin/mpiexec.hydra -launcher rsh -launcher-exec /nonexistent/cairn -hosts 10.9.0.2:1,10.9.0.3:1 -n 2 -iface eth0 prog"
	if got := strings.Join(argv, " "); got != want || strings.Join(env, " ") != "HYDRA_LAUNCHER_EXTRA_ARGS=rsh" {
		t.Errorf("mpich:\n got %s %v\nwant %s", got, env, want)
	}
	if err := CheckKind("ompi"); err == nil {
		t.Error("an unknown MPI was accepted")
	}
}

// TestPeers: a rank's peers from $CAIRN_PEERS, or, without it, from the
// job's subnet and size, as the coordinator hands out addresses.
func TestPeers(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	got, err := Peers(env(map[string]string{"CAIRN_PEERS": "10.224.0.2,10.224.0.3"}))
	if err != nil || len(got) != 2 || got[1].String() != "10.224.0.3" {
		t.Fatalf("from the list: %v %v", got, err)
	}
	got, err = Peers(env(map[string]string{EnvSubnet: "10.224.4.0/22", "CAIRN_SIZE": "600"}))
	if err != nil || len(got) != 600 || got[0].String() != "10.224.4.2" || got[599].String() != "10.224.6.89" {
		t.Fatalf("from the subnet: %d peers, first %v, last %v, %v", len(got), got[0], got[len(got)-1], err)
	}
	for _, bad := range []map[string]string{
		{"CAIRN_PEERS": "10.224.0.2,nope"},
		{EnvSubnet: "10.224.0.0/24", "CAIRN_SIZE": "254"}, // one past the broadcast address
		{EnvSubnet: "10.224.0.0/24"},
		{"CAIRN_SIZE": "2"},
	} {
		if got, err := Peers(env(bad)); err == nil {
			t.Errorf("%v: %v, want an error", bad, got)
		}
	}
}
