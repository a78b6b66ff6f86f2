package container

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// Spec types: the subset of the OCI runtime spec cairn writes. Field names
// and JSON tags follow opencontainers/runtime-spec.
type (
	ociSpec struct {
		OCIVersion string     `json:"ociVersion"`
		Process    ociProcess `json:"process"`
		Root       ociRoot    `json:"root"`
		Hostname   string     `json:"hostname"`
		Mounts     []ociMount `json:"mounts"`
		Linux      ociLinux   `json:"linux"`
		// Annotations: runc reads CRIU's config file from org.criu.config.
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	ociProcess struct {
		Terminal        bool            `json:"terminal"`
		User            ociUser         `json:"user"`
		Args            []string        `json:"args"`
		Env             []string        `json:"env"`
		Cwd             string          `json:"cwd"`
		Capabilities    ociCapabilities `json:"capabilities"`
		Rlimits         []ociRlimit     `json:"rlimits,omitempty"`
		NoNewPrivileges bool            `json:"noNewPrivileges"`
	}
	ociUser struct {
		UID uint32 `json:"uid"`
		GID uint32 `json:"gid"`
	}
	ociCapabilities struct {
		Bounding    []string `json:"bounding"`
		Effective   []string `json:"effective"`
		Permitted   []string `json:"permitted"`
		Ambient     []string `json:"ambient"`
		Inheritable []string `json:"inheritable,omitempty"`
	}
	ociRlimit struct {
		Type string `json:"type"`
		Hard uint64 `json:"hard"`
		Soft uint64 `json:"soft"`
	}
	ociRoot struct {
		Path     string `json:"path"`
		Readonly bool   `json:"readonly"`
	}
	ociMount struct {
		Destination string   `json:"destination"`
		Type        string   `json:"type"`
		Source      string   `json:"source"`
		Options     []string `json:"options,omitempty"`
	}
	ociLinux struct {
		UIDMappings   []ociIDMap     `json:"uidMappings,omitempty"`
		GIDMappings   []ociIDMap     `json:"gidMappings,omitempty"`
		Resources     ociResources   `json:"resources"`
		CgroupsPath   string         `json:"cgroupsPath"`
		Namespaces    []ociNamespace `json:"namespaces"`
		MaskedPaths   []string       `json:"maskedPaths"`
		ReadonlyPaths []string       `json:"readonlyPaths"`
		Seccomp       *ociSeccomp    `json:"seccomp,omitempty"`
	}
	ociResources struct {
		Devices []ociDevice `json:"devices"`
		CPU     *ociCPU     `json:"cpu,omitempty"`
		Memory  *ociMemory  `json:"memory,omitempty"`
		Pids    *ociPids    `json:"pids,omitempty"`
	}
	ociPids struct {
		Limit int64 `json:"limit"`
	}
	ociCPU struct {
		Quota  int64  `json:"quota"`
		Period uint64 `json:"period"`
	}
	ociMemory struct {
		Limit int64 `json:"limit"`
	}
	ociDevice struct {
		Allow  bool   `json:"allow"`
		Access string `json:"access"`
	}
	ociIDMap struct {
		ContainerID uint32 `json:"containerID"`
		HostID      uint32 `json:"hostID"`
		Size        uint32 `json:"size"`
	}
	ociNamespace struct {
		Type string `json:"type"`
		Path string `json:"path,omitempty"`
	}
)

// defaultCaps is what an ordinary program inside a rank expects to be able
// to do with its own files and processes: runc's default set less
// CAP_NET_RAW (raw sockets could forge frames to the host past the bridge
// guard) and CAP_AUDIT_WRITE (the host's audit log is not a rank's).
var defaultCaps = []string{
	"CAP_KILL", "CAP_NET_BIND_SERVICE",
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID",
	"CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_SYS_CHROOT",
}

// ToolsMount is where Config.Tools is mounted in the container, and
// EnvTools the variable that tells the container so.
const (
	ToolsMount = "/.cairn"
	EnvTools   = "CAIRN_TOOLS"
)

// UserNSBase is the host uid (and gid) of root in a --userns container; it
// maps UserNSSize ids. The range is the one podman and LXC leave to
// containers by default.
const (
	UserNSBase = 1000000
	UserNSSize = 65536
)

// userNS puts the container in a user namespace of its own, its root being
// host uid UserNSBase: it keeps its capabilities over what it owns (its
// namespaces, its files in /tmp) and has none over the host's files, which
// it sees as owned by nobody. sysfs and cgroupfs cannot be mounted from a
// user namespace that does not own the network namespace, so they are
// bound read-only from the host instead.
func userNS(s *ociSpec) {
	m := []ociIDMap{{ContainerID: 0, HostID: UserNSBase, Size: UserNSSize}}
	s.Linux.UIDMappings, s.Linux.GIDMappings = m, m
	s.Linux.Namespaces = append(s.Linux.Namespaces, ociNamespace{Type: "user"})
	var mounts []ociMount
	for _, mt := range s.Mounts {
		switch mt.Destination {
		case "/sys":
			mt = ociMount{"/sys", "none", "/sys", []string{"rbind", "nosuid", "noexec", "nodev", "ro"}}
		case "/sys/fs/cgroup":
			continue
		}
		mounts = append(mounts, mt)
	}
	s.Mounts = mounts
}

// writeSpec writes the runc bundle config for st into its bundle dir. The
// spec is a pure function of st, so a restore writes exactly the spec the
// checkpointed container ran with (CRIU needs the same mounts).
func writeSpec(st *State, bundle, rootPath, netnsPath, criuConf string) error {
	caps := ociCapabilities{Bounding: defaultCaps, Effective: defaultCaps, Permitted: defaultCaps, Ambient: defaultCaps}
	env := append([]string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"CAIRN_CONTAINER=" + st.Config.Name,
		"CAIRN_IP=" + st.Addr.String(),
	}, st.Config.Env...)
	cwd := st.Config.Cwd
	if cwd == "" {
		cwd = "/"
	}
	s := ociSpec{
		OCIVersion: "1.0.2-dev",
		Process: ociProcess{
			Args: st.Config.Args, Env: env, Cwd: cwd, Capabilities: caps,
			NoNewPrivileges: true,
		},
		Root:     ociRoot{Path: rootPath},
		Hostname: st.Config.Hostname,
		Mounts: []ociMount{
			{"/proc", "proc", "proc", nil},
			{"/dev", "tmpfs", "tmpfs", []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{"/dev/pts", "devpts", "devpts", []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{"/dev/shm", "tmpfs", "shm", []string{"nosuid", "noexec", "nodev", "mode=1777", "size=262144k"}},
			{"/dev/mqueue", "mqueue", "mqueue", []string{"nosuid", "noexec", "nodev"}},
			{"/sys", "sysfs", "sysfs", []string{"nosuid", "noexec", "nodev", "ro"}},
			{"/sys/fs/cgroup", "cgroup", "cgroup", []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		},
		Linux: ociLinux{
			Resources:   ociResources{Devices: []ociDevice{{Allow: false, Access: "rwm"}}},
			CgroupsPath: st.CgroupsPath,
			Namespaces: []ociNamespace{
				{Type: "pid"}, {Type: "network", Path: netnsPath}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"},
			},
			MaskedPaths: []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
			Seccomp:       seccompFilter(),
		},
	}
	for _, v := range st.Config.Volumes {
		opts := []string{"rbind", "rprivate", "nosuid", "nodev"}
		if v.ReadOnly {
			opts = append(opts, "ro")
		}
		s.Mounts = append(s.Mounts, ociMount{v.Path, "none", v.Host, opts})
	}
	if st.Config.CPUs > 0 {
		const period = 100000 // µs
		s.Linux.Resources.CPU = &ociCPU{Quota: int64(st.Config.CPUs * period), Period: period}
	}
	if st.Config.Memory > 0 {
		s.Linux.Resources.Memory = &ociMemory{Limit: st.Config.Memory}
	}
	if p := st.Config.pidsLimit(); p > 0 {
		s.Linux.Resources.Pids = &ociPids{Limit: p}
	}
	if st.Config.Tools != "" {
		s.Mounts = append(s.Mounts, ociMount{ToolsMount, "none", st.Config.Tools, []string{"rbind", "ro", "nosuid", "nodev"}})
		s.Process.Env = append(s.Process.Env, EnvTools+"="+ToolsMount)
	}
	apiSpec(&s, st, bundle)
	if st.Config.UserNS {
		userNS(&s)
	}
	if criuConf != "" {
		s.Annotations = map[string]string{"org.criu.config": criuConf}
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600)
}

// DefaultPidsLimit is a container's pids limit unless its Config says
// otherwise: room for an MPI rank's threads and helpers many times over,
// far from a node's process table (pid_max is 4 million).
const DefaultPidsLimit = 4096

// pidsLimit is the limit of the container's pids cgroup; 0 for none.
func (c Config) pidsLimit() int64 {
	switch {
	case c.PidsLimit == 0:
		return DefaultPidsLimit
	case c.PidsLimit < 0:
		return 0
	}
	return c.PidsLimit
}
