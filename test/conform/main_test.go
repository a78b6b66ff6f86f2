package conform_test

import (
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/agent"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// pendingTTL is the agents' agent.PendingTTL here: set before any agent
// serves, for the whole test binary.
const pendingTTL = 2 * time.Second

func TestMain(m *testing.M) {
	agent.PendingTTL = pendingTTL
	testutil.Main(m)
}
