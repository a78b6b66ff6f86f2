package launch

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MPI implementations a job can be launched with (cairn run --mpi).
const (
	OpenMPI = "openmpi" // Debian's openmpi-bin: mpirun.openmpi, orted
	MPICH   = "mpich"   // Debian's mpich: mpiexec.hydra, hydra_pmi_proxy
)

// Kinds lists the MPI implementations, for messages.
var Kinds = []string{OpenMPI, MPICH}

// CheckKind refuses an MPI implementation cairn does not know.
func CheckKind(kind string) error {
	switch kind {
	case OpenMPI, MPICH:
		return nil
	}
	return fmt.Errorf("unknown MPI %q: want %s", kind, strings.Join(Kinds, " or "))
}

// Paths of the launchers and of what a rank needs, as Debian 12 installs
// them: the unversioned mpirun and mpicc are alternatives that may point
// to either implementation, so cairn always names one.
const (
	openMPIRun = "/usr/bin/mpirun.openmpi"
	mpichExec  = "/usr/bin/mpiexec.hydra"
)

// MPICHFix is the file name, in a rank's tools dir ($CAIRN_TOOLS: the
// cairn binary that runs as its launch daemon and agent, and this), of the library preloaded
// into MPICH's processes (deploy/mpich/cairn-mpich-finalize.c): Debian
// 12's MPICH 4.0.2 over UCX 1.13's TCP transport hangs in MPI_Finalize in
// most runs, even without cairn, because it disconnects endpoints without
// first synchronising the ranks; the library runs a PMI barrier before the
// first disconnect, as later MPICH releases do.
const MPICHFix = "libcairn-mpich-finalize.so"

// launcher returns the launcher's command line and the environment it
// adds, for a job of peers (rank order) on subnet whose rank 0 runs it,
// with the tools at tools, starting program. One MPI process per rank:
// host K of the launcher's host list is rank K, so MPI rank K runs in
// cairn rank K.
func launcher(kind string, peers []netip.Addr, subnet netip.Prefix, iface, tools string, program []string) (argv, env []string) {
	hosts := make([]string, len(peers))
	for i, p := range peers {
		hosts[i] = p.String() + ":1"
	}
	n := strconv.Itoa(len(peers))
	switch kind {
	case OpenMPI:
		argv = []string{openMPIRun,
			"--allow-run-as-root", // ranks run as root in their container
			"-np", n, "-H", strings.Join(hosts, ","),
			"--bind-to", "none", // the rank's cgroup places it; do not pin
			// The daemons are started through cairn's agent, never ssh.
			"--mca", "plm_rsh_agent", filepath.Join(tools, "cairn") + " rsh",
			// Out-of-band and data traffic on the job network only.
			"--mca", "oob_tcp_if_include", subnet.String(),
			"--mca", "btl_tcp_if_include", subnet.String(),
			// One process per rank: TCP between ranks, no shared-memory
			// transport (and so no CMA, which needs ptrace between ranks).
			"--mca", "btl", "self,tcp",
			"--mca", "pml", "ob1",
		}
	case MPICH:
		argv = []string{mpichExec,
			// hydra runs "LAUNCHER-EXEC EXTRA-ARGS HOST CMD": EXTRA-ARGS
			// (HYDRA_LAUNCHER_EXTRA_ARGS) selects cairn's rsh.
			"-launcher", "rsh", "-launcher-exec", filepath.Join(tools, "cairn"),
			"-hosts", strings.Join(hosts, ","), "-n", n,
			"-iface", iface, // proxies reach mpiexec at an IP, not a name
		}
		env = []string{"HYDRA_LAUNCHER_EXTRA_ARGS=rsh"}
		if fix := filepath.Join(tools, MPICHFix); fileExists(fix) {
			argv = append(argv, "-genv", "LD_PRELOAD", fix)
		}
	}
	return append(argv, program...), env
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// lookPath finds a program as a shell would, on PATH, without os/exec
// (see reaper).
func lookPath(prog, path string) (string, error) {
	if strings.Contains(prog, "/") {
		if isExecutable(prog) {
			return prog, nil
		}
		return "", fmt.Errorf("%s: not an executable file", prog)
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		if p := filepath.Join(d, prog); isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found on PATH (%s)", prog, path)
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}
