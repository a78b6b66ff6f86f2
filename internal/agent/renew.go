package agent

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/pki"
	"github.com/cairn-hpc/cairn/internal/rpc"
)

// DefaultRenewBefore is how long before its certificate expires an agent
// asks the coordinator for a new one.
const DefaultRenewBefore = 30 * 24 * time.Hour

// renewEvery is how often the agent looks at its certificate's expiry.
const renewEvery = time.Hour

// keepRenewed asks the coordinator to renew creds' certificate whenever
// it expires within before, looking at once and then every `every`,
// until ctx is done. The new key is made here and never leaves the node;
// the certificate is written to the credentials' directory and used from
// the next handshake on. A coordinator that holds no CA is logged once,
// at WARN: the operator renews by hand then.
func keepRenewed(ctx context.Context, creds *pki.Credentials, co *rpc.CoordClient, before, every time.Duration, log *slog.Logger) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	noCA := false
	for {
		if left := time.Until(creds.Cert().NotAfter); left < before {
			err := renew(ctx, creds, co)
			var ae *agentv1.Error
			switch {
			case errors.As(err, &ae) && ae.Code == coordv1.CodeNoCA:
				if !noCA {
					log.Warn("certificate not renewed: the coordinator holds no CA (coordinator --ca); renew it by hand (cairn node cert --renew)", "valid_until", creds.Cert().NotAfter)
				}
				noCA = true
			case err != nil:
				log.Warn("certificate not renewed; trying again later", "err", err, "valid_until", creds.Cert().NotAfter)
			default:
				noCA = false
				log.Info("certificate renewed by the coordinator", "serial", creds.Cert().SerialNumber.Text(16), "valid_until", creds.Cert().NotAfter)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// renew makes a key, has the coordinator sign a certificate for it and
// installs both.
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
