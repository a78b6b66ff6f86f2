package testbed

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cairn-hpc/cairn/internal/durable"
)

// Cluster is what DIR/cluster.json records of a testbed: enough for the
// CLI to find the coordinator and for Down to remove everything.
type Cluster struct {
	Prefix   string `json:"prefix"`   // of its namespaces, bridges and nodes
	Underlay string `json:"underlay"` // the subnet between nodes
	// Coordinator is every coordinator's API address, separated by
	// commas: what agents and the CLI take.
	Coordinator  string  `json:"coordinator"`
	Coordinators []Coord `json:"coordinators"`
	// UI is the URL of the coordinator's dashboard ("": none).
	UI      string    `json:"ui,omitempty"`
	Nodes   []Node    `json:"nodes"`
	Created time.Time `json:"created"`

	dir string
}

// Coord is a coordinator of a testbed.
type Coord struct {
	Name string `json:"name"`
	Addr string `json:"addr"`           // its API's
	Peer string `json:"peer,omitempty"` // its etcd's peer URL, with several
	Dir  string `json:"dir"`            // its state, logs and credentials
	PID  int    `json:"pid"`
}

// Log is the coordinator's output.
func (c Coord) Log() string { return filepath.Join(c.Dir, "coordinator.log") }

// Node is a node of a testbed.
type Node struct {
	Name    string `json:"name"`
	Addr    string `json:"addr"` // the agent's listen address
	Data    string `json:"data"`
	Staging string `json:"staging"`
	PID     int    `json:"pid"` // the agent's
	// Argv is the command line Up started the agent with (nsenter into
	// the node's namespace, then the agent): what Revive starts again.
	Argv []string `json:"argv,omitempty"`
	// ClockOffset is how far the node's monotonic and boot-time clocks
	// run ahead of the host's, in seconds (Config.ClockOffsets).
	ClockOffset int64 `json:"clock_offset,omitempty"`
}

// Dir is where the testbed of the data dir data lives.
func Dir(data string) string { return filepath.Join(data, "cluster") }

func file(dir string) string { return filepath.Join(dir, "cluster.json") }

// Load reads the testbed in dir; an error satisfying
// errors.Is(err, os.ErrNotExist) says there is none. The record says
// which processes Down kills and which command line Revive runs, so a
// cluster.json anyone but this user could have written is refused.
func Load(dir string) (*Cluster, error) {
	f, err := os.Open(file(dir))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return nil, err
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return nil, fmt.Errorf("%s: owned by uid %d with mode %o: only a file of uid %d that no one else may write is trusted (cairn up writes it so)",
			file(dir), st.Uid, st.Mode&0o777, os.Geteuid())
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("%s: %w", file(dir), err)
	}
	return c, nil
}

// Save records c in its cluster.json, durably.
func (c *Cluster) Save() error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return durable.WriteFile(file(c.dir), b, 0o600)
}

// Dir is the testbed's directory.
func (c *Cluster) Dir() string { return c.dir }

// ClientCreds is the directory of the credentials of the testbed's
// clients (the CLI).
func (c *Cluster) ClientCreds() string { return filepath.Join(c.dir, "client") }

// UITokenFile holds the token browsers log in to the dashboard with.
func (c *Cluster) UITokenFile() string { return filepath.Join(c.dir, "coordinator", "ui-token") }

// CoordinatorLog is the first coordinator's output (the only one's, of
// most testbeds).
func (c *Cluster) CoordinatorLog() string {
	return filepath.Join(c.dir, "coordinator", "coordinator.log")
}

// Coord returns the coordinator named name.
func (c *Cluster) Coord(name string) (Coord, bool) {
	for _, co := range c.Coordinators {
		if co.Name == name {
			return co, true
		}
	}
	return Coord{}, false
}

// AgentLog is the output of a node's agent.
func (c *Cluster) AgentLog(node string) string { return filepath.Join(c.nodeDir(node), "agent.log") }

func (c *Cluster) nodeDir(node string) string { return filepath.Join(c.dir, "nodes", node) }

// Node returns the node named name.
func (c *Cluster) Node(name string) (Node, bool) {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return Node{}, false
}

// PIDs are the testbed's processes: the coordinators, then every agent.
func (c *Cluster) PIDs() []int {
	var pids []int
	for _, co := range c.Coordinators {
		pids = append(pids, co.PID)
	}
	for _, n := range c.Nodes {
		pids = append(pids, n.PID)
	}
	return pids
}
