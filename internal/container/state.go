package container

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cairn-hpc/cairn/internal/durable"
	"github.com/cairn-hpc/cairn/internal/names"
	"github.com/cairn-hpc/cairn/internal/netw"
)

// ErrNotFound is returned for a container name that does not exist.
var ErrNotFound = errors.New("no such container")

// ErrExists is returned when creating a container whose name is taken.
var ErrExists = errors.New("container already exists")

// ErrNotRunning is returned by operations that need a running container.
var ErrNotRunning = errors.New("container is not running")

// ErrRunning is returned by operations that refuse a running container.
var ErrRunning = errors.New("container is running")

// ValidName checks a container name: letters, digits, '_', '.', '-', not
// starting with a punctuation mark, at most 63 bytes (see [names.Container]).
func ValidName(name string) error { return names.Container(name) }

// Config is what a user asks for when running a container. It is recorded
// in every checkpoint, and a restore runs the container with it again.
type Config struct {
	Name     string   `json:"name"`
	Args     []string `json:"args"`
	Env      []string `json:"env,omitempty"`
	RootFS   string   `json:"rootfs,omitempty"` // lower layer; "" means the host's /
	Hostname string   `json:"hostname"`
	Cwd      string   `json:"cwd,omitempty"`
	// Net, when set, puts the container in a network namespace that someone
	// else made and owns (a rank of a job network): the Manager then neither
	// allocates an address nor creates or deletes a namespace.
	Net *NetAttach `json:"net,omitempty"`
	// UserNS runs the container in a user namespace of its own, its root
	// mapped to host uid UserNSBase (see userNS).
	UserNS bool `json:"userns,omitempty"`
	// Tools is a host directory mounted read-only at ToolsMount: the cairn
	// binary and libraries an MPI rank's launch daemon needs. A restore
	// mounts the same path, which tools dirs named by content keep valid on
	// every node running the same cairn.
	Tools string `json:"tools,omitempty"`
	// Volumes are host directories bound into the container (input and
	// results on a shared file system). They are outside its checkpoints:
	// a restore does not roll them back, and needs them at the same host
	// path on the node it restores on.
	Volumes []Volume `json:"volumes,omitempty"`
	// CPUs limits the container to this many CPUs' time (0: no limit).
	CPUs float64 `json:"cpus,omitempty"`
	// Memory limits the container's memory, in bytes (0: no limit).
	Memory int64 `json:"memory,omitempty"`
	// SecretEnv names the variables of Env that hold secrets (an MPI
	// job's launch secret): the container starts with them, and they are
	// left out of the config its images record, which `cairn images` and
	// exports show, unless the image is files-only: its command then
	// starts afresh with the recorded environment.
	SecretEnv []string `json:"secret_env,omitempty"`
	// PidsLimit bounds the container's processes and threads together
	// (the pids cgroup): 0 means DefaultPidsLimit, a negative value no
	// limit. A fork bomb in a container then fails in the container
	// instead of taking its node's process table.
	PidsLimit int64 `json:"pids_limit,omitempty"`
	// RankAPI gives the container a directory of its own for the rank API
	// (Manager.APIDir, kept across restores), bound read-write at
	// rankv1.SocketDir, with rankv1.EnvSocket naming the socket in it
	// (apidir.go).
	RankAPI bool `json:"rank_api,omitempty"`
}

// Volume binds a host directory into a container.
type Volume struct {
	Host     string `json:"host"` // absolute path on the node
	Path     string `json:"path"` // absolute path in the container
	ReadOnly bool   `json:"ro,omitempty"`
}

// NetAttach names a network namespace made by the caller and the address
// the container has in it.
type NetAttach struct {
	Netns string     `json:"netns"` // path of the namespace, e.g. /run/netns/NAME
	Addr  netip.Addr `json:"addr"`
}

// State is a container's persistent record (state.json).
type State struct {
	Config       Config        `json:"config"`
	Addr         netip.Addr    `json:"addr"`
	Endpoint     netw.Endpoint `json:"endpoint"`
	CgroupsPath  string        `json:"cgroups_path"`
	Created      time.Time     `json:"created"`
	Started      time.Time     `json:"started"`
	ShimPID      int           `json:"shim_pid"`
	RestoredFrom string        `json:"restored_from,omitempty"` // "name:seq"
	// Checkpointed is set when a checkpoint stopped the container, so its
	// end is shown as that rather than as a kill.
	Checkpointed bool `json:"checkpointed,omitempty"`
	// Restart is the files-only checkpoint the container's command was
	// started afresh on (rankv1.EnvRestart in its environment); 0 for a
	// run, or a restore by CRIU.
	Restart int `json:"restart,omitempty"`
	// StartPending: the container's init is made (runc create) and its
	// command waits for Resume to start it (a files-only restore asked to
	// stay paused).
	StartPending bool `json:"start_pending,omitempty"`
}

// Exit is what the shim records when the container's init ends.
type Exit struct {
	Code   int       `json:"code"`             // exit status, or 128+signal
	Signal string    `json:"signal,omitempty"` // set if killed by a signal
	Time   time.Time `json:"time"`
	// Reason says why cairn ended the container, if it did.
	Reason string `json:"reason,omitempty"`
}

func (m *Manager) dir(name string) string { return filepath.Join(m.opts.DataDir, "containers", name) }

func (m *Manager) loadState(name string) (*State, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(m.dir(name), "state.json"))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("read state of %s: %w", name, err)
	}
	return &st, nil
}

func (m *Manager) saveState(st *State) error {
	return writeJSONAtomic(filepath.Join(m.dir(st.Config.Name), "state.json"), st)
}

func writeJSONAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return durable.WriteFile(path, b, 0o600)
}

func readExit(dir string) (*Exit, error) {
	b, err := os.ReadFile(filepath.Join(dir, "exit.json"))
	if err != nil {
		return nil, err
	}
	var e Exit
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// ParseVolumes reads volumes written "HOST:PATH" or "HOST:PATH:ro".
func ParseVolumes(specs []string) ([]Volume, error) {
	var out []Volume
	for _, spec := range specs {
		parts := strings.Split(spec, ":")
		v := Volume{}
		switch {
		case len(parts) == 2:
		case len(parts) == 3 && (parts[2] == "ro" || parts[2] == "rw"):
			v.ReadOnly = parts[2] == "ro"
		default:
			return nil, fmt.Errorf("%w: volume %q: want HOST:PATH or HOST:PATH:ro", ErrBadConfig, spec)
		}
		v.Host, v.Path = parts[0], parts[1]
		out = append(out, v)
	}
	return out, nil
}
