package launch

import (
	"fmt"
	"io"
)

// RankInit is `cairn rankinit --mpi KIND -- PROGRAM ARGS...`, the init of
// an MPI job's ranks: it runs the launch daemon configured from the
// environment and returns the process's exit code (2 for a wrong call).
func RankInit(args []string, stderr io.Writer) int {
	if len(args) < 3 || args[0] != "--mpi" || args[2] != "--" {
		fmt.Fprintln(stderr, "usage: cairn rankinit --mpi openmpi|mpich -- PROGRAM [ARGS...] (the init of an MPI job's ranks)")
		return 2
	}
	cfg, err := ConfigFromEnv(args[1], args[3:])
	if err != nil {
		fmt.Fprintln(stderr, "cairn rankinit:", err)
		return 2
	}
	return Run(cfg)
}
