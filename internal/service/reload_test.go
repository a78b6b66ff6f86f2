package service_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/service"
)

// fakeCreds is a certificate that a renewal replaces.
type fakeCreds struct {
	mu   sync.Mutex
	cert *x509.Certificate
}

func (f *fakeCreds) Reload() (bool, error) { return false, nil }
func (f *fakeCreds) Cert() *x509.Certificate {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cert
}
func (f *fakeCreds) set(c *x509.Certificate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cert = c
}

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestKeepRenewed: a certificate that expires within the window is
// renewed; a failure is logged once for each reason and tried again at
// every look; a certificate far from expiry is left alone.
func TestKeepRenewed(t *testing.T) {
	creds := &fakeCreds{cert: &x509.Certificate{SerialNumber: big.NewInt(1), NotAfter: time.Now().Add(time.Hour)}}
	var logs lockedBuf
	log := slog.New(slog.NewTextHandler(&logs, nil))
	var mu sync.Mutex
	tries := 0
	renew := func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		tries++
		if tries <= 3 {
			return errors.New("the coordinator holds no CA")
		}
		creds.set(&x509.Certificate{SerialNumber: big.NewInt(2), NotAfter: time.Now().Add(365 * 24 * time.Hour)})
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		service.KeepRenewed(ctx, creds, 24*time.Hour, 5*time.Millisecond, "the test", renew, log)
		close(done)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for creds.Cert().SerialNumber.Int64() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("not renewed; logs:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // looks after the renewal: nothing to do
	cancel()
	<-done
	out := logs.String()
	if n := strings.Count(out, "certificate not renewed"); n != 1 {
		t.Errorf("three failures of one reason logged %d times:\n%s", n, out)
	}
	if n := strings.Count(out, "certificate renewed by the test"); n != 1 {
		t.Errorf("one renewal logged %d times:\n%s", n, out)
	}
	mu.Lock()
	defer mu.Unlock()
	if tries != 4 {
		t.Errorf("renew called %d times, want 3 failures then 1 renewal", tries)
	}
}
