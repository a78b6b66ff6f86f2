package agent

import (
	"context"
	"crypto/x509"
	"fmt"
	"time"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

// DefaultRenewBefore is how long before its certificate expires an agent
// asks the coordinator for a new one.
const DefaultRenewBefore = 30 * 24 * time.Hour

// renewEvery is how often the agent looks at its certificate's expiry.
const renewEvery = time.Hour

// renew makes a key, which never leaves the node, has the coordinator
// sign a certificate for it and installs both: the next handshakes use
// them. A coordinator that holds no CA answers coordv1.CodeNoCA, whose
// message says to renew by hand.
func renew(ctx context.Context, creds *pki.Credentials, co *rpc.CoordClient) error {
	csr, key, err := creds.RenewalRequest()
	if err != nil {
		return err
	}
	out, err := co.RenewCert(ctx, coordv1.RenewCert{CSR: csr})
	if err != nil {
		return err
	}
	cert, err := x509.ParseCertificate(out.Cert)
	if err != nil {
		return fmt.Errorf("the certificate the coordinator sent: %w", err)
	}
	return creds.Install(cert, key)
}
