package deploy

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/testbed"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// root is the source tree.
func root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// installPackage makes a release with `make dist`, installs its .deb on
// this machine with dpkg -i (purged again when the test ends) and checks
// what an operator or a program gets from it: cairn on PATH stamped with
// the release, `cairn check` passing, the units, the configuration as
// conffiles, libcairn through pkg-config, the Python client for Debian's
// python3, man pages and completion. It refuses to run where a cairn
// package is already installed: it would replace someone's.
func installPackage(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("dpkg-query", "-W", "-f=${Status}", "cairn").CombinedOutput(); err == nil && strings.Contains(string(out), "installed") {
		t.Fatalf("a cairn package is installed on this machine (%s): the rehearsal installs its own; remove it first (dpkg --purge cairn)", out)
	}
	dist := t.TempDir()
	// At the lowest CPU priority: the build takes both cores for a
	// minute, and other packages' clusters run beside this one with
	// timing-sensitive rounds.
	if out, err := exec.Command("nice", "-n", "19", "make", "-C", root(), "dist", "DIST="+dist).CombinedOutput(); err != nil {
		t.Fatalf("make dist: %v\n%s", err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dist, "cairn_*.deb"))
	tars, _ := filepath.Glob(filepath.Join(dist, "cairn-*-linux-*.tar.gz"))
	if len(debs) != 1 || len(tars) != 1 {
		t.Fatalf("make dist made %q and %q, want one .deb and one tarball", debs, tars)
	}
	sums := exec.Command("sha256sum", "-c", "SHA256SUMS")
	sums.Dir = dist
	if out, err := sums.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum -c SHA256SUMS: %v\n%s", err, out)
	}
	// The tarball's cairn is static.
	if out, err := exec.Command("tar", "-tzf", tars[0]).CombinedOutput(); err != nil || !strings.Contains(string(out), "/bin/cairn\n") {
		t.Fatalf("tar -tzf %s: %v; no bin/cairn:\n%s", tars[0], err, out)
	}

	t.Cleanup(func() {
		if out, err := exec.Command("dpkg", "--purge", "cairn").CombinedOutput(); err != nil {
			t.Errorf("dpkg --purge cairn: %v\n%s", err, out)
		}
		if _, err := os.Stat("/usr/bin/cairn"); err == nil {
			t.Errorf("/usr/bin/cairn is left after dpkg --purge")
		}
	})
	if out, err := exec.Command("dpkg", "-i", debs[0]).CombinedOutput(); err != nil {
		t.Fatalf("dpkg -i %s: %v\n%s", debs[0], err, out)
	}

	// cairn, from PATH as an operator types it.
	want := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(tars[0]), "cairn-"), "-linux-"+runtime.GOARCH+".tar.gz")
	if out, err := exec.Command("cairn", "version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "cairn "+want+" ") {
		t.Errorf("cairn version: %v, %q; want the release %s", err, out, want)
	}
	if p, err := exec.LookPath("cairn"); err != nil || p != "/usr/bin/cairn" {
		t.Errorf("cairn on PATH: %q, %v; want /usr/bin/cairn", p, err)
	}
	if out, err := exec.Command("/usr/bin/cairn", "check").CombinedOutput(); err != nil {
		t.Errorf("cairn check, installed: %v\n%s", err, out)
	}
	for src, dst := range map[string]string{
		"deploy/systemd/cairn-agent.service":       "/lib/systemd/system/cairn-agent.service",
		"deploy/systemd/cairn-coordinator.service": "/lib/systemd/system/cairn-coordinator.service",
		"deploy/systemd/agent.env":                 "/etc/cairn/agent.env",
		"deploy/prometheus/cairn-rules.yml":        "/usr/share/cairn/prometheus/cairn-rules.yml",
		"docs/operations.md":                       "/usr/share/doc/cairn/operations.md",
		"scripts/install-criu.sh":                  "/usr/share/cairn/install-criu",
	} {
		a, _ := os.ReadFile(filepath.Join(root(), src))
		b, err := os.ReadFile(dst)
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s is not %s as installed: %v", dst, src, err)
		}
	}
	if out, err := exec.Command("dpkg-query", "--showformat=${Conffiles}", "-W", "cairn").CombinedOutput(); err != nil ||
		!strings.Contains(string(out), "/etc/cairn/agent.env") || !strings.Contains(string(out), "/etc/cairn/coordinator.env") {
		t.Errorf("the environment files are not conffiles (an upgrade would overwrite an operator's): %v\n%s", err, out)
	}
	for _, f := range []string{"/usr/share/man/man1/cairn.1.gz", "/usr/share/man/man1/cairn-node-cert.1.gz", "/usr/share/bash-completion/completions/cairn"} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("not installed: %v", err)
		}
	}
	// libcairn, as a C program's build finds it.
	flags, err := exec.Command("pkg-config", "--cflags", "--libs", "cairn").CombinedOutput()
	if err != nil {
		t.Fatalf("pkg-config cairn: %v\n%s", err, flags)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "info.c")
	prog := "#include <cairn.h>\n#include <stdio.h>\nint main(void) { printf(\"%p\\n\", (void *)cairn_checkpoint); return 0; }\n"
	if err := os.WriteFile(src, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	cc := exec.Command("sh", "-c", "cc -o "+filepath.Join(dir, "info")+" "+src+" $(pkg-config --cflags --libs cairn)")
	if out, err := cc.CombinedOutput(); err != nil {
		t.Errorf("a C program built against the installed libcairn (pkg-config): %v\n%s", err, out)
	} else if out, err := exec.Command(filepath.Join(dir, "info")).CombinedOutput(); err != nil {
		t.Errorf("a program linked to the installed libcairn: %v\n%s", err, out)
	}
	// The Python client, for Debian's python3, and pip-installable.
	if out, err := exec.Command("/usr/bin/python3", "-c", "import cairn; print(cairn.__file__, cairn.__version__)").CombinedOutput(); err != nil ||
		!strings.HasPrefix(string(out), "/usr/lib/python3/dist-packages/cairn.py ") {
		t.Errorf("import cairn in Debian's python3: %v\n%s", err, out)
	}
	// From a copy: setuptools builds in the source directory (build/,
	// *.egg-info), which must stay the tree's.
	target, src := t.TempDir(), filepath.Join(t.TempDir(), "python")
	if out, err := exec.Command("cp", "-r", filepath.Join(root(), "deploy", "python"), src).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	pip := exec.Command("/usr/bin/python3", "-m", "pip", "install", "--no-build-isolation", "--no-index", "--target", target, src)
	if out, err := pip.CombinedOutput(); err != nil {
		t.Errorf("pip install deploy/python: %v\n%s", err, out)
	} else if _, err := os.Stat(filepath.Join(target, "cairn.py")); err != nil {
		t.Errorf("pip install deploy/python installed no cairn.py: %v", err)
	}
}

// installedUnit reads a unit as the package installed it.
func installedUnit(t *testing.T, name string) testutil.Unit {
	return testutil.ReadUnit(t, filepath.Join("/lib/systemd/system", name))
}

// daemonExe is the binary a daemon's process runs.
func daemonExe(t *testing.T, pid int) string {
	t.Helper()
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// renewAndReload renews node's agent credentials as an operator would
// (`cairn node cert --renew` on the CA's machine), tells the agent to
// read them again as `systemctl reload` does (SIGHUP to its process), and
// checks that it then presents the new certificate, with no restart.
func renewAndReload(t *testing.T, c *testutil.Cluster, envFile string, node testbed.Node) {
	t.Helper()
	creds := credsOf(t, envFile)
	shown := func() []byte { return presented(t, c, node) }
	before := shown()
	out, err := exec.Command(c.Bin, "--data", testbed.Dir(c.Data), "node", "cert", "--renew", "-o", creds).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "renewed credentials in "+creds) {
		t.Fatalf("cairn node cert --renew -o %s: %v\n%s", creds, err, out)
	}
	renewed := mustLoad(t, creds).Cert().Raw
	if bytes.Equal(renewed, before) {
		t.Fatalf("node cert --renew left %s's certificate as it was", node.Name)
	}
	if err := syscall.Kill(node.PID, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, 10*time.Second, func() (bool, string) {
		return bytes.Equal(shown(), renewed), node.Name + "'s agent still presents its old certificate after SIGHUP"
	})
	if !testbed.Running(node.PID) {
		t.Fatalf("%s's agent (pid %d) is gone after SIGHUP", node.Name, node.PID)
	}
	if log := c.AgentLog(node.Name); !strings.Contains(log, "certificate reloaded") {
		t.Errorf("%s's agent logged no reload:\n%s", node.Name, log)
	}
}

// credsOf is the credentials directory an agent's environment file names.
func credsOf(t *testing.T, envFile string) string {
	t.Helper()
	for _, kv := range testutil.ReadEnvFile(t, envFile) {
		if v, ok := strings.CutPrefix(kv, "CAIRN_AGENT_CREDS="); ok {
			return v
		}
	}
	t.Fatalf("%s sets no CAIRN_AGENT_CREDS", envFile)
	return ""
}

// presented is the certificate node's agent presents to a new connection.
func presented(t *testing.T, c *testutil.Cluster, node testbed.Node) []byte {
	t.Helper()
	client, err := pki.LoadCredentials(filepath.Join(testbed.Dir(c.Data), "client"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", node.Addr, pki.ClientConfig(client, node.Name))
	if err != nil {
		t.Fatalf("TLS to %s's agent: %v", node.Name, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Raw
}

func mustLoad(t *testing.T, dir string) *pki.Credentials {
	t.Helper()
	c, err := pki.LoadCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// mpiRing builds examples/mpi/mpiring.c with Open MPI.
func mpiRing(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "mpiring")
	if out, err := exec.Command("/usr/bin/mpicc.openmpi", "-O2", "-o", bin, filepath.Join(root(), "examples", "mpi", "mpiring.c")).CombinedOutput(); err != nil {
		t.Fatalf("build the MPI program (make setup installs Open MPI): %v\n%s", err, out)
	}
	return bin
}

var mpiFinal = regexp.MustCompile(`FINAL size=(\d+) iters=(\d+) .* checksum=([0-9a-f]{16})`)

// mpiReference is the checksum of an uninterrupted run of prog on the
// host, plain mpirun over loopback.
func mpiReference(t *testing.T, prog string, np int, args ...string) string {
	t.Helper()
	argv := append([]string{"--allow-run-as-root", "--oversubscribe", "-np", fmt.Sprint(np), "--mca", "btl", "self,tcp",
		"--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo", prog}, args...)
	out, err := exec.Command("/usr/bin/mpirun.openmpi", argv...).CombinedOutput()
	m := mpiFinal.FindStringSubmatch(string(out))
	if err != nil || m == nil {
		t.Fatalf("reference run: %v\n%s", err, out)
	}
	return m[3]
}
