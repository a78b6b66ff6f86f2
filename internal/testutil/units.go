package testutil

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/netw"
	"github.com/cairn-hpc/cairn/internal/testbed"
)

// Unit is what a systemd service unit file says of how to start its
// daemon: its ExecStart= words and its EnvironmentFile=.
type Unit struct {
	ExecStart       []string
	EnvironmentFile string
	Settings        map[string]string // every Key=Value of [Service], the last of each key
}

// ReadUnit reads the [Service] section of a unit file.
func ReadUnit(t testing.TB, path string) Unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := Unit{Settings: map[string]string{}}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: %q is no setting", path, line)
			}
			u.Settings[k] = v
			switch k {
			case "ExecStart":
				u.ExecStart = strings.Fields(v)
			case "EnvironmentFile":
				u.EnvironmentFile = strings.TrimPrefix(v, "-")
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(u.ExecStart) == 0 {
		t.Fatalf("%s: no ExecStart", path)
	}
	return u
}

// ReadEnvFile reads an environment file as systemd's EnvironmentFile=
// does: KEY=VALUE lines, comments (#, ;) and blank lines skipped, a value
// in double quotes unquoted (\" and \\ inside), one in single quotes
// taken as it is.
func ReadEnvFile(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !envKey.MatchString(k) {
			t.Fatalf("%s:%d: %q is no KEY=VALUE", path, i+1, line)
		}
		switch {
		case len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"':
			v = strings.NewReplacer(`\"`, `"`, `\\`, `\`).Replace(v[1 : len(v)-1])
		case len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'':
			v = v[1 : len(v)-1]
		}
		out = append(out, k+"="+v)
	}
	return out
}

var envKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// envLine is one line of an environment file setting key to v.
func envLine(key, v string) string {
	return key + `="` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(v) + `"`
}

// flagVars maps each flag of `cairn SUB --help` (its own and the global
// ones) to the environment variable its usage names, and tells which
// are repeatable and how their values are joined. A flag without a
// variable fails the test: every daemon flag must have one.
func (c *Cluster) flagVars(sub string) map[string]flagVar {
	c.t.Helper()
	out, err := exec.Command(c.Bin, sub, "--help").CombinedOutput()
	if err != nil {
		c.t.Fatalf("cairn %s --help: %v\n%s", sub, err, out)
	}
	vars := map[string]flagVar{}
	for _, line := range strings.Split(string(out), "\n") {
		m := helpFlag.FindStringSubmatch(line)
		if m == nil || m[1] == "help" || m[1] == "version" {
			continue
		}
		v := varRE.FindStringSubmatch(line)
		if v == nil {
			c.t.Fatalf("cairn %s: flag --%s names no environment variable:\n%s", sub, m[1], line)
		}
		fv := flagVar{name: v[1]}
		switch {
		case strings.Contains(line, "':'-separated"):
			fv.sep = ":"
		case strings.Contains(m[2], "Array") || strings.HasSuffix(m[2], "s") && m[2] != "string":
			fv.sep = " "
		}
		vars[m[1]] = fv
	}
	return vars
}

type flagVar struct {
	name string
	sep  string // "" for one value; ":" or " " (quoted words) for several
}

var (
	helpFlag = regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)(?: (\w+))?\s`)
	varRE    = regexp.MustCompile(`\(\$(CAIRN_[A-Z0-9_]+)`)
)

// unitEnv turns a daemon's command line (cairn [global flags] SUB
// [flags]) into the environment file its unit would read instead, and
// keeps the CAIRN_ variables of its environment (a daemon launched by
// LaunchAsUnit has no flags).
func (c *Cluster) unitEnv(sub string, argv []string, environ []string) []string {
	c.t.Helper()
	vars := c.flagVars(sub)
	values := map[string][]string{}
	var order []string
	for i := 1; i < len(argv); i++ {
		a := argv[i]
		if a == sub {
			continue
		}
		name, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") {
			c.t.Fatalf("%q in %q: not a flag", a, argv)
		}
		if !ok {
			i++
			v = argv[i]
		}
		if _, ok := values[name]; !ok {
			order = append(order, name)
		}
		values[name] = append(values[name], v)
	}
	var lines []string
	for _, name := range order {
		fv, ok := vars[name]
		if !ok {
			c.t.Fatalf("cairn %s: no flag --%s", sub, name)
		}
		vs := values[name]
		switch fv.sep {
		case "":
			if len(vs) > 1 {
				c.t.Fatalf("--%s given %d times", name, len(vs))
			}
		case " ":
			for i, v := range vs {
				vs[i] = `'` + v + `'`
			}
		}
		lines = append(lines, envLine(fv.name, strings.Join(vs, fv.sep)))
	}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "CAIRN_") && !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, k+"=") }) {
			lines = append(lines, envLine(k, v))
		}
	}
	return lines
}

func procEnviron(t testing.TB, pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// LaunchAgentAsUnit stops node's agent as systemd stops a unit with
// KillMode=process (SIGTERM to its own process, nothing else of the
// node), writes the environment file its unit reads instead of its
// command line (every flag as its variable, plus extra), and starts it
// again in the node's network namespace by execStart, the unit's
// ExecStart with the binary as its first word, and that file read as
// EnvironmentFile= reads it. It waits until the agent joined again, and
// returns the file.
func (c *Cluster) LaunchAgentAsUnit(node string, execStart []string, extra ...string) string {
	c.t.Helper()
	f := c.File()
	for i, n := range f.Nodes {
		if n.Name != node {
			continue
		}
		joined := func() int { return strings.Count(c.AgentLog(node), "joined the cluster") }
		before := joined()
		env := c.stopForUnit(n.PID, "agent")
		file := filepath.Join(testbed.Dir(c.Data), "agent-"+node+".env")
		c.writeEnvFile(file, env, extra)
		argv := append([]string{"nsenter", "--net=" + netw.NetnsPath(node), "--"}, execStart...)
		f.Nodes[i].PID = c.spawn(f.AgentLog(node), argv, ReadEnvFile(c.t, file))
		c.save(f)
		WaitUntil(c.t, 30*time.Second, func() (bool, string) {
			n := joined()
			return n > before, fmt.Sprintf("%s's agent joined %d times, %d before its relaunch", node, n, before)
		})
		return file
	}
	c.t.Fatalf("no node %s", node)
	return ""
}

// LaunchCoordinatorAsUnit is LaunchAgentAsUnit for the (first)
// coordinator, on the host; it returns once the coordinator answers.
func (c *Cluster) LaunchCoordinatorAsUnit(execStart []string, extra ...string) string {
	c.t.Helper()
	f := c.File()
	co := f.Coordinators[0]
	env := c.stopForUnit(co.PID, "coordinator")
	file := filepath.Join(testbed.Dir(c.Data), "coordinator.env")
	c.writeEnvFile(file, env, extra)
	f.Coordinators[0].PID = c.spawn(co.Log(), execStart, ReadEnvFile(c.t, file))
	c.save(f)
	WaitUntil(c.t, 30*time.Second, func() (bool, string) {
		out, err := c.Run("nodes")
		return err == nil, fmt.Sprintf("cairn nodes: %v\n%s", err, out)
	})
	return file
}

// stopForUnit reads a daemon's configuration (its command line and its
// CAIRN_ variables), stops it with SIGTERM and waits until it is gone,
// and returns that configuration as environment file lines.
func (c *Cluster) stopForUnit(pid int, sub string) []string {
	c.t.Helper()
	env := c.unitEnv(sub, agentCmdline(c.t, pid), procEnviron(c.t, pid))
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		c.t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for testbed.Running(pid) {
		if time.Now().After(deadline) {
			c.t.Fatalf("cairn %s (pid %d) still runs 60 s after SIGTERM", sub, pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return env
}

func (c *Cluster) writeEnvFile(file string, lines, extra []string) {
	c.t.Helper()
	var b strings.Builder
	b.WriteString("# written by the test as the unit's EnvironmentFile\n")
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		b.WriteString(envLine(k, v) + "\n")
	}
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		c.t.Fatal(err)
	}
}
