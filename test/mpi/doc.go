// Package mpi tests MPI jobs end to end: examples/mpi/mpiring.c under
// Open MPI and MPICH checkpointed and restarted elsewhere, migrated, and
// restarted after a node loss; MPI in one container; and an unmodified
// mpi4py application (examples/mpi/life.py). CAIRN_SOAK=1 runs every
// scenario under both MPIs.
package mpi
