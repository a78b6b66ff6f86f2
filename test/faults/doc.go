// Package faults runs the fault matrix's agent class on real agents with
// real CRIU: a node's agent is killed (SIGKILL) while it holds at a
// failpoint of a protocol step, and started again; the job must settle
// running by itself, every rank once, its newest restorable checkpoint
// must restore, and its result must be exact. make test runs the commit
// case (the agent dies with the decision in hand, before the image is
// stored); CAIRN_FAULTS=1 (make faults) runs every case.
package faults
