package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/ringapp"
	"github.com/cairn-hpc/cairn/internal/testbed"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// systemdDir is deploy/systemd in the source tree.
func systemdDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "deploy", "systemd")
}

var units = []string{"cairn-agent.service", "cairn-coordinator.service"}

// TestUnitsVerify: systemd-analyze verify finds nothing to say of the
// units, in a root holding the units, systemd's own and cairn at the path
// their ExecStart names. The settings the daemons rely on are there:
// Type=notify, the configuration from an EnvironmentFile, an agent whose
// restart signals only its own process (its ranks' shims live in its
// cgroup). Every variable the example environment files set is one a
// flag of the daemon names.
func TestUnitsVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze (package systemd, which make setup installs) is not installed: %v", err)
	}
	bin := testutil.CairnBinary(t)
	root := t.TempDir()
	for _, d := range []string{"usr/bin", "usr/lib/systemd", "etc/systemd/system"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("cp", "-a", "/usr/lib/systemd/system", filepath.Join(root, "usr/lib/systemd/")).CombinedOutput(); err != nil {
		t.Fatalf("copy systemd's units: %v\n%s", err, out)
	}
	if out, err := exec.Command("cp", bin, filepath.Join(root, "usr/bin/cairn")).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// ExecReload's kill, where Debian 12 has it (/bin is /usr/bin).
	if out, err := exec.Command("cp", "/usr/bin/kill", filepath.Join(root, "usr/bin/kill")).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := os.Symlink("usr/bin", filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	for _, u := range units {
		if out, err := exec.Command("cp", filepath.Join(systemdDir(), u), filepath.Join(root, "etc/systemd/system", u)).CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	out, err := exec.Command(analyze, append([]string{"verify", "--root=" + root, "--man=no"}, units...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", strings.Join(units, " "), err, out)
	}

	for _, c := range []struct {
		unit, sub, env string
		want           map[string]string
	}{
		{"cairn-agent.service", "agent", "agent.env", map[string]string{"Type": "notify", "KillMode": "process", "EnvironmentFile": "/etc/cairn/agent.env"}},
		{"cairn-coordinator.service", "coordinator", "coordinator.env", map[string]string{"Type": "notify", "EnvironmentFile": "/etc/cairn/coordinator.env"}},
	} {
		u := testutil.ReadUnit(t, filepath.Join(systemdDir(), c.unit))
		if !slices.Equal(u.ExecStart, []string{"/usr/bin/cairn", c.sub}) {
			t.Errorf("%s: ExecStart %q, want /usr/bin/cairn %s (everything else from the environment file)", c.unit, u.ExecStart, c.sub)
		}
		for k, v := range c.want {
			if u.Settings[k] != v {
				t.Errorf("%s: %s=%q, want %q", c.unit, k, u.Settings[k], v)
			}
		}
		help, err := exec.Command(bin, c.sub, "--help").CombinedOutput()
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range testutil.ReadEnvFile(t, filepath.Join(systemdDir(), c.env)) {
			k, _, _ := strings.Cut(kv, "=")
			if !strings.Contains(string(help), "($"+k+")") && !strings.Contains(string(help), "($"+k+",") {
				t.Errorf("%s sets %s, which no flag of cairn %s names", c.env, k, c.sub)
			}
		}
	}
}

// notifications listens as the service manager does for the daemons'
// sd_notify datagrams, and keeps them.
type notifications struct {
	path string
	mu   sync.Mutex
	got  []string
}

func listenNotify(t *testing.T) *notifications {
	n := &notifications{path: filepath.Join(t.TempDir(), "notify")}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: n.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.got = append(n.got, string(buf[:k]))
			n.mu.Unlock()
		}
	}()
	return n
}

// wait waits for a datagram holding every one of parts.
func (n *notifications) wait(t *testing.T, parts ...string) {
	t.Helper()
	testutil.WaitUntil(t, 30*time.Second, func() (bool, string) {
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, g := range n.got {
			all := true
			for _, p := range parts {
				all = all && strings.Contains(g, p)
			}
			if all {
				return true, ""
			}
		}
		return false, fmt.Sprintf("no notification with %q among %q", parts, n.got)
	})
}

func healthy(t *testing.T, addr string) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz at %s: %v", addr, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(b) != "ok\n" {
		t.Fatalf("GET /healthz at %s: %d %q, want 200 ok", addr, resp.StatusCode, b)
	}
}

func freePort(t *testing.T, host string) string {
	t.Helper()
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestPackageRehearsal: a deployment as docs/operations.md describes it,
// from the package `make dist` builds, installed with dpkg -i.
//
//  1. The ring job runs on a cluster of this tree's build. The
//     coordinator, then each agent in turn, is stopped as systemd stops
//     its unit (SIGTERM to the daemon's own process) and started as the
//     installed unit starts it: its ExecStart (/usr/bin/cairn, the
//     package's) configured only through its environment file. That is
//     an upgrade under a running job. Each daemon tells the service
//     manager it is ready and answers /healthz; an agent logs JSON when
//     its file says so.
//  2. An MPI job starts on the daemons the units started; both jobs
//     checkpoint.
//  3. Every agent is restarted again by its unit, one by one, while both
//     jobs run ("systemctl restart cairn-agent" on each node).
//  4. An agent's certificate is renewed and reloaded (SIGHUP, as
//     systemctl reload sends it) without a restart.
//
// Throughout, no rank of either job restarts; checkpoints commit after
// each step, a rank migrates onto the spare node, a new job runs, and
// both jobs end with an uninterrupted run's results.
func TestPackageRehearsal(t *testing.T) {
	installPackage(t)
	c := testutil.NewCluster(t, 3)
	notify := listenNotify(t)
	agentUnit := installedUnit(t, "cairn-agent.service")
	coordUnit := installedUnit(t, "cairn-coordinator.service")
	if agentUnit.ExecStart[0] != "/usr/bin/cairn" || coordUnit.ExecStart[0] != "/usr/bin/cairn" {
		t.Fatalf("installed units start %q and %q, want the package's /usr/bin/cairn", agentUnit.ExecStart, coordUnit.ExecStart)
	}
	// Running since the jobs started: no restart, both still running.
	running := func(after string, jobs ...string) {
		t.Helper()
		for _, job := range jobs {
			if j := c.Job(job); j.State != "running" || j.Restarts != 0 {
				t.Fatalf("after %s, %s is %s with %d restarts (%s)", after, job, j.State, j.Restarts, j.Reason)
			}
		}
	}

	// Long enough to run through every step below, on a loaded machine too.
	messages := 16 * testutil.RingMessages
	c.OK(append([]string{"run", "--job", "ring", "--ranks", "2", "--per-node", "1"}, c.RingArgs(messages)...)...)
	c.WaitProgress("ring", 2, 0, 60*time.Second)
	c.OK("checkpoint", "ring")

	// 1. The upgrade to the package, by the units.
	health := freePort(t, "127.0.0.1")
	// The coordinator holds the CA, to renew agents' certificates.
	c.LaunchCoordinatorAsUnit(coordUnit.ExecStart, "NOTIFY_SOCKET="+notify.path, "CAIRN_COORDINATOR_HEALTH_LISTEN="+health,
		"CAIRN_COORDINATOR_CA="+filepath.Join(testbed.Dir(c.Data), "pki"))
	notify.wait(t, "READY=1", "coordinator")
	healthy(t, health)
	if exe := daemonExe(t, c.File().Coordinators[0].PID); exe != "/usr/bin/cairn" {
		t.Fatalf("the coordinator runs %s, not the package's /usr/bin/cairn", exe)
	}
	envFiles := map[string]string{}
	agentExtra := func(i int, n testbed.Node) []string {
		host, _, _ := net.SplitHostPort(n.Addr)
		extra := []string{"NOTIFY_SOCKET=" + notify.path, "CAIRN_AGENT_HEALTH_LISTEN=" + net.JoinHostPort(host, "7421")}
		if i == 0 {
			extra = append(extra, "CAIRN_AGENT_LOG_FORMAT=json")
		}
		return extra
	}
	for i, n := range c.File().Nodes {
		host, _, _ := net.SplitHostPort(n.Addr)
		before := len(c.AgentLog(n.Name))
		envFiles[n.Name] = c.LaunchAgentAsUnit(n.Name, agentUnit.ExecStart, agentExtra(i, n)...)
		notify.wait(t, "READY=1", "node "+n.Name+" serving")
		healthy(t, net.JoinHostPort(host, "7421"))
		t.Logf("%s's agent started by its unit, configured by %s", n.Name, envFiles[n.Name])
		if i == 0 {
			jsonLines(t, n.Name, c.AgentLog(n.Name)[before:])
		}
		running(n.Name+"'s agent was upgraded", "ring")
	}
	for _, n := range c.File().Nodes {
		if exe := daemonExe(t, n.PID); exe != "/usr/bin/cairn" {
			t.Fatalf("%s's agent runs %s, not the package's /usr/bin/cairn", n.Name, exe)
		}
	}
	c.Bin = "/usr/bin/cairn" // the CLI too, from here on
	c.OK("checkpoint", "ring")

	// 2. An MPI job on the daemons the units started.
	prog := mpiRing(t)
	mpiArgs := []string{"--iters", "1200", "--every", "20"}
	want := mpiReference(t, prog, 3, append(mpiArgs, "--sleep-ms", "0")...)
	c.OK(append([]string{"run", "--job", "mpi", "--ranks", "3", "--per-node", "1", "--mpi", "openmpi", "--", prog}, append(mpiArgs, "--sleep-ms", "50")...)...)
	testutil.WaitUntil(t, 90*time.Second, func() (bool, string) {
		out := c.Logs("mpi", 0)
		return strings.Contains(out, "progress 40/"), "rank 0 of the MPI job:\n" + out
	})
	c.OK("checkpoint", "mpi")

	// 3. Every agent restarted by its unit while both jobs run. The
	// second is told to renew a year before expiry: it has the
	// coordinator renew its certificate at once.
	for i, n := range c.File().Nodes {
		extra := agentExtra(i, n)
		var before []byte
		if i == 1 {
			extra = append(extra, "CAIRN_AGENT_RENEW_BEFORE=9000h")
			before = presented(t, c, n)
		}
		c.LaunchAgentAsUnit(n.Name, agentUnit.ExecStart, extra...)
		if i == 1 {
			c.WaitAgentLog(n.Name, "certificate renewed by the coordinator", 30*time.Second)
			n = c.File().Nodes[i]
			now := presented(t, c, n)
			if bytes.Equal(now, before) || !bytes.Equal(now, mustLoad(t, credsOf(t, envFiles[n.Name])).Cert().Raw) {
				t.Fatalf("%s's agent, renewed by the coordinator, does not present the certificate now in its credentials", n.Name)
			}
		}
		running(n.Name+"'s agent restarted", "ring", "mpi")
	}
	c.OK("checkpoint", "ring")
	c.OK("checkpoint", "mpi")

	// 4. A certificate renewed and reloaded, no restart; the cluster
	// goes on talking to that agent.
	n0 := c.File().Nodes[0]
	renewAndReload(t, c, envFiles[n0.Name], n0)
	c.OK("checkpoint", "mpi")
	c.OK("checkpoint", "ring")
	running("the certificate was renewed", "ring", "mpi")

	// A rank restored by agents the units started.
	c.OK("migrate", "ring/0", "--to", c.Unused(c.Status("ring").Placement))
	// And a job started by them: runc run, which waits for a container to
	// say it is ready when it finds NOTIFY_SOCKET in its environment.
	c.OK("run", "--job", "hello", "--ranks", "3", "--", "/bin/sh", "-c", "echo hello from $CAIRN_CONTAINER")
	if out, err := c.Run("wait", "hello"); err != nil {
		t.Fatalf("a job started by agents their units started: %v\n%s", err, out)
	}
	if out, err := c.Run("wait", "mpi"); err != nil {
		t.Fatalf("wait mpi: %v\n%s", err, out)
	}
	if m := mpiFinal.FindStringSubmatch(c.Logs("mpi", 0)); m == nil || m[3] != want {
		t.Fatalf("the MPI job's result %q, want %s (an uninterrupted run's); rank 0:\n%s", m, want, c.Logs("mpi", 0))
	}
	if got, want := c.Result("ring"), ringapp.Expected(2, messages, 64, 1); got != want {
		t.Fatalf("result %s, want %s (an uninterrupted run's)", got, want)
	}
	for _, job := range []string{"ring", "mpi"} {
		if j := c.Job(job); j.Restarts != 0 {
			t.Errorf("%s restarted %d times while its agents did", job, j.Restarts)
		}
	}

	// A variable a flag refuses, and a flag given with it on the command
	// line (the flag wins).
	cmd := exec.Command("/usr/bin/cairn", "agent", "--creds", t.TempDir())
	cmd.Env = append(os.Environ(), "CAIRN_AGENT_HEALTH_EVERY=soon")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "$CAIRN_AGENT_HEALTH_EVERY") {
		t.Errorf("an agent with CAIRN_AGENT_HEALTH_EVERY=soon: %v, want exit 2 naming the variable:\n%s", err, out)
	}
	cmd = exec.Command("/usr/bin/cairn", "agent", "--creds", t.TempDir(), "--log-format", "xml")
	cmd.Env = append(os.Environ(), "CAIRN_AGENT_LOG_FORMAT=json")
	out, err = cmd.CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), `--log-format "xml"`) {
		t.Errorf("an agent with --log-format xml and CAIRN_AGENT_LOG_FORMAT=json: %v, want exit 2 for the flag's value:\n%s", err, out)
	}
}

// jsonLines checks that what an agent logged is one JSON object a line,
// among them its join.
func jsonLines(t *testing.T, node, log string) {
	t.Helper()
	joined := false
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%s's agent, told CAIRN_AGENT_LOG_FORMAT=json, logged a line that is not JSON: %q", node, line)
		}
		joined = joined || rec["msg"] == "joined the cluster"
	}
	if !joined {
		t.Errorf("%s's agent logged no join in JSON:\n%s", node, log)
	}
}
