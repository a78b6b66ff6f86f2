package agenttest_test

import (
	"github.com/cairn-hpc/cairn/internal/coord"
	"github.com/cairn-hpc/cairn/internal/coord/agenttest"
)

// The suite's Agent is coord.Agent: the suite runs against every agent
// the coordinator can call, and calls nothing the coordinator does not.
var (
	_ agenttest.Agent = coord.Agent(nil)
	_ coord.Agent     = agenttest.Agent(nil)
)
