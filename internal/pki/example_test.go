package pki_test

import (
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"

	"github.com/cairn-hpc/cairn/internal/pki"
)

// Example shows what `cairn init` and `cairn node cert NODE` do, and how an
// agent then configures its connection to the coordinator.
func Example() {
	tmp, err := os.MkdirTemp("", "cairn-pki")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(tmp)

	// cairn init
	ca, err := pki.Init(filepath.Join(tmp, "ca"), pki.InitOptions{})
	if err != nil {
		log.Fatal(err)
	}

	// cairn node cert node1
	creds, err := ca.Issue("node1", pki.Agent, pki.IssueOptions{IPs: []net.IP{net.ParseIP("10.0.0.7")}})
	if err != nil {
		log.Fatal(err)
	}
	if err := creds.Write(filepath.Join(tmp, "node1")); err != nil {
		log.Fatal(err)
	}

	// On node1, the agent dials the coordinator.
	mine, err := pki.LoadCredentials(filepath.Join(tmp, "node1"))
	if err != nil {
		log.Fatal(err)
	}
	cfg := pki.ClientConfig(mine, "coord")
	fmt.Println(mine.Name, mine.Role, mine.ClusterID == ca.ClusterID, cfg.ServerName)
	// Output: node1 agent true coord
}
