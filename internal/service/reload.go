package service

import (
	"context"
	"crypto/x509"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Credentials are a daemon's TLS credentials as KeepCredentials keeps
// them: read again from their files, and the certificate in use.
type Credentials interface {
	Reload() (bool, error)
	Cert() *x509.Certificate
}

// ReloadEvery is how often a daemon looks for renewed credentials by
// itself; SIGHUP (systemctl reload) makes it look at once.
const ReloadEvery = time.Minute

// ExpiryWarning is how long before its certificate expires a daemon
// starts to warn, once a day (the alert CairnCertExpiresSoon fires then
// too).
const ExpiryWarning = 30 * 24 * time.Hour

// KeepCredentials reloads creds on SIGHUP and every `every` until ctx is
// done, so that a renewed certificate (`cairn node cert --renew`) is used
// without a restart. A renewal is logged at INFO; credentials refused
// (another node's, expired, half-written) at WARN, once for each new
// reason, and the ones in use are kept; a certificate in use that expires
// within ExpiryWarning at WARN, once a day. SIGHUP is taken from here on:
// it no longer ends the process.
func KeepCredentials(ctx context.Context, creds Credentials, every time.Duration, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		tick := time.NewTicker(every)
		defer tick.Stop()
		var refused string
		var warned time.Time
		check := func(asked bool) {
			changed, err := creds.Reload()
			switch {
			case err != nil:
				if asked || err.Error() != refused {
					log.Warn("credentials not reloaded", "err", err)
				}
				refused = err.Error()
			case changed:
				refused = ""
				log.Info("certificate reloaded", "serial", creds.Cert().SerialNumber.Text(16), "valid_until", creds.Cert().NotAfter)
			case asked:
				log.Info("credentials reloaded: certificate unchanged", "valid_until", creds.Cert().NotAfter)
			}
			if left := time.Until(creds.Cert().NotAfter); left < ExpiryWarning && time.Since(warned) > 24*time.Hour {
				warned = time.Now()
				log.Warn("certificate expires soon: renew it (cairn node cert --renew)", "valid_until", creds.Cert().NotAfter, "left", left.Round(time.Hour).String())
			}
		}
		check(false)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				check(true)
			case <-tick.C:
				check(false)
			}
		}
	}()
}

// KeepRenewed has renew replace creds' certificate whenever it expires
// within before, looking at once and then every `every`, until ctx is
// done: renew gets a new certificate (the agent from the coordinator, a
// coordinator from the CA it holds) and installs it. A renewal is logged
// at INFO, as made by by; a failure at WARN, once for each new reason
// (as KeepCredentials logs a refused reload), and tried again at the next
// look.
func KeepRenewed(ctx context.Context, creds Credentials, before, every time.Duration, by string, renew func(context.Context) error, log *slog.Logger) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	var failed string
	for {
		if time.Until(creds.Cert().NotAfter) < before {
			if err := renew(ctx); err != nil {
				if err.Error() != failed {
					log.Warn("certificate not renewed; trying again later", "by", by, "err", err, "valid_until", creds.Cert().NotAfter)
				}
				failed = err.Error()
			} else {
				failed = ""
				log.Info("certificate renewed by "+by, "serial", creds.Cert().SerialNumber.Text(16), "valid_until", creds.Cert().NotAfter)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
