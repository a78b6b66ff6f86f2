package catalog_test

import (
	"fmt"
	"net"
	"os"
	"testing"
)

// dialEnv names the unix socket a re-executed test binary dials and
// exits: 0 if it connected, 1 with the error on stdout if not. See
// dialAs.
const dialEnv = "CAIRN_TEST_DIAL_UNIX"

func TestMain(m *testing.M) {
	if path := os.Getenv(dialEnv); path != "" {
		c, err := net.Dial("unix", path)
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		c.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}
