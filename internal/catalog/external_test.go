package catalog_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/catalog"
)

// writeCert writes a self-signed certificate and its key as PEM files in
// dir and returns their paths.
func writeCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcd-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestExternalConfig: an external etcd is reached over TLS with the
// credentials given, or over a plain transport only where no other
// machine is involved.
func TestExternalConfig(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeCert(t, dir)
	creds := catalog.TLSFiles{CA: cert, Cert: cert, Key: key}
	for _, tc := range []struct {
		name      string
		endpoints []string
		files     catalog.TLSFiles
		wantErr   string // "" for success
		wantTLS   bool
	}{
		{"https with credentials", []string{"https://10.0.0.1:2379", "https://etcd-2:2379"}, creds, "", true},
		{"https with system roots", []string{"https://etcd:2379"}, catalog.TLSFiles{}, "", true},
		{"unix socket", []string{"unix:///run/etcd/etcd.sock"}, catalog.TLSFiles{}, "", false},
		{"http to loopback", []string{"http://127.0.0.1:2379", "http://[::1]:2379", "http://localhost:2379"}, catalog.TLSFiles{}, "", false},
		{"http to another host", []string{"http://10.0.0.1:2379"}, catalog.TLSFiles{}, "plain http", false},
		{"http to a name", []string{"http://etcd:2379"}, catalog.TLSFiles{}, "plain http", false},
		{"credentials for plain http", []string{"http://127.0.0.1:2379"}, creds, "not TLS", false},
		{"mixed", []string{"https://etcd:2379", "http://127.0.0.1:2379"}, creds, "all TLS or none", false},
		{"certificate without key", []string{"https://etcd:2379"}, catalog.TLSFiles{Cert: cert}, "needs its key", false},
		{"not a CA file", []string{"https://etcd:2379"}, catalog.TLSFiles{CA: key}, "no PEM certificate", false},
		{"missing CA file", []string{"https://etcd:2379"}, catalog.TLSFiles{CA: filepath.Join(dir, "none")}, "no such file", false},
		{"other scheme", []string{"grpc://etcd:2379"}, catalog.TLSFiles{}, "want https://", false},
		{"none", nil, catalog.TLSFiles{}, "no endpoints", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := catalog.ExternalConfig(tc.endpoints, tc.files)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ExternalConfig(%q) = %v, want an error with %q", tc.endpoints, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ExternalConfig(%q): %v", tc.endpoints, err)
			}
			if (cfg.TLS != nil) != tc.wantTLS {
				t.Fatalf("ExternalConfig(%q): TLS %v, want TLS %v", tc.endpoints, cfg.TLS, tc.wantTLS)
			}
			if tc.wantTLS && tc.files.CA != "" && (cfg.TLS.RootCAs == nil || len(cfg.TLS.Certificates) != 1) {
				t.Fatalf("ExternalConfig(%q): roots %v, %d client certificates; want the CA file's and one", tc.endpoints, cfg.TLS.RootCAs, len(cfg.TLS.Certificates))
			}
		})
	}
}
