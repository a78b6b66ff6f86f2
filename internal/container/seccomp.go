package container

// A container's root is the host's root (no user namespace: CRIU could
// not checkpoint it), so a file it makes setuid or setgid on a volume is
// one a host user could run with root's or a group's rights. The
// container's seccomp filter refuses every call that would set those
// bits (EPERM), and openat2, whose mode it cannot read, as if the kernel
// lacked it (ENOSYS: libraries then use openat). Everything else is
// allowed: the capabilities runc drops, the masks and the network guard
// keep a rank from the host.

type (
	ociSeccomp struct {
		DefaultAction string       `json:"defaultAction"`
		Architectures []string     `json:"architectures"`
		Syscalls      []ociSyscall `json:"syscalls"`
	}
	ociSyscall struct {
		Names    []string    `json:"names"`
		Action   string      `json:"action"`
		ErrnoRet *uint       `json:"errnoRet,omitempty"`
		Args     []ociSysArg `json:"args,omitempty"`
	}
	ociSysArg struct {
		Index    uint   `json:"index"`
		Value    uint64 `json:"value"`
		ValueTwo uint64 `json:"valueTwo"`
		Op       string `json:"op"`
	}
)

// Mode bits no container may set on a file.
const (
	modeSetuid = 0o4000
	modeSetgid = 0o2000
)

// modeArg lists, for each call that takes a mode, the index of its mode.
var modeArg = map[string]uint{
	"chmod": 1, "fchmod": 1, "fchmodat": 2,
	"open": 2, "openat": 3, "creat": 1,
	"mknod": 1, "mknodat": 2,
}

// seccompFilter is the filter of every container.
func seccompFilter() *ociSeccomp {
	eperm, enosys := uint(1), uint(38)
	f := &ociSeccomp{DefaultAction: "SCMP_ACT_ALLOW", Architectures: []string{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"}}
	for _, name := range []string{"chmod", "fchmod", "fchmodat", "open", "openat", "creat", "mknod", "mknodat"} {
		for _, bit := range []uint64{modeSetuid, modeSetgid} {
			f.Syscalls = append(f.Syscalls, ociSyscall{Names: []string{name}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm,
				Args: []ociSysArg{{Index: modeArg[name], Value: bit, ValueTwo: bit, Op: "SCMP_CMP_MASKED_EQ"}}})
		}
	}
	f.Syscalls = append(f.Syscalls, ociSyscall{Names: []string{"openat2"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &enosys})
	return f
}
