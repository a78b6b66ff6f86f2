package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"
)

var (
	// ErrExists is returned by [Init] when the directory already holds a CA
	// and InitOptions.Force is not set.
	ErrExists = errors.New("cluster CA already exists")
	// ErrNotFound is returned when a CA or credentials file is missing. It
	// is wrapped together with fs.ErrNotExist.
	ErrNotFound = errors.New("not found")
	// ErrCorrupt is returned when a CA or credentials file exists but is
	// not what cairn wrote: not PEM, not parseable, not a cairn
	// certificate, or a key that does not match its certificate.
	ErrCorrupt = errors.New("corrupt certificate or key")
)

// Organization is the O of every certificate cairn makes.
const Organization = "cairn"

// caCNPrefix begins the CA's CN; the cluster id follows.
const caCNPrefix = "cairn cluster "

// Default validity periods and the clock skew allowance.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultLeafValidity = 365 * 24 * time.Hour
	clockSkew           = 5 * time.Minute
)

// InitOptions tune [Init].
type InitOptions struct {
	// Validity is how long the CA is valid; zero means DefaultCAValidity.
	Validity time.Duration
	// Force replaces an existing CA in the directory. Every credential the
	// old CA issued stops being trusted by holders of the new ca.crt.
	Force bool
}

// CA is a cluster's certificate authority. It is safe for concurrent use.
type CA struct {
	// ClusterID identifies the cluster; see the package documentation.
	ClusterID string
	// Cert is the CA's self-signed certificate, the content of ca.crt.
	Cert *x509.Certificate

	key *ecdsa.PrivateKey
}

// Init makes a new cluster: a CA with a random cluster id, written as
// dir/ca.crt and dir/ca.key (mode 0600). dir is created (mode 0700) if
// missing. If dir already holds ca.crt or ca.key, Init returns an error
// wrapping [ErrExists] unless opts.Force is set.
func Init(dir string, opts InitOptions) (*CA, error) {
	validity := opts.Validity
	if validity == 0 {
		validity = DefaultCAValidity
	}
	if validity < 0 {
		return nil, fmt.Errorf("init CA in %s: negative validity %v", dir, validity)
	}
	if !opts.Force {
		p, err := exists(dir, CACertFile, CAKeyFile)
		if err != nil {
			return nil, fmt.Errorf("init CA in %s: %w", dir, err)
		}
		if p != "" {
			return nil, fmt.Errorf("init CA: %s: %w", p, ErrExists)
		}
	}
	ca, err := newCA(time.Now(), validity)
	if err != nil {
		return nil, fmt.Errorf("init CA in %s: %w", dir, err)
	}
	keyPEM, err := encodeKey(ca.key)
	if err != nil {
		return nil, fmt.Errorf("init CA in %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, fmt.Errorf("init CA: %w", err)
	}
	// Key first: a crash in between leaves a key without a certificate,
	// which Load reports and Init refuses to overwrite without Force,
	// never a certificate whose key is lost.
	if err := writeFile(filepath.Join(dir, CAKeyFile), keyPEM, keyMode); err != nil {
		return nil, fmt.Errorf("init CA: write key: %w", err)
	}
	if err := writeFile(filepath.Join(dir, CACertFile), encodeCert(ca.Cert), certMode); err != nil {
		return nil, fmt.Errorf("init CA: write certificate: %w", err)
	}
	return ca, nil
}

func newCA(now time.Time, validity time.Duration) (*CA, error) {
	var idBytes [16]byte
	if _, err := rand.Read(idBytes[:]); err != nil {
		return nil, fmt.Errorf("make cluster id: %w", err)
	}
	id := hex.EncodeToString(idBytes[:])
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Organization: []string{Organization},
			CommonName:   caCNPrefix + id,
		},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("sign CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	return &CA{ClusterID: id, Cert: cert, key: key}, nil
}

// newSerial returns a random positive 128-bit serial number.
func newSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	n, err := rand.Int(rand.Reader, limit)
	if err != nil {
		return nil, fmt.Errorf("make serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

// Load reads the CA that [Init] wrote in dir. A missing file gives an error
// wrapping [ErrNotFound]; a file that is not a cairn CA certificate, or a
// key that does not match it, gives one wrapping [ErrCorrupt].
func Load(dir string) (*CA, error) {
	cert, err := readCert(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	id, err := caClusterID(cert)
	if err == nil {
		err = cert.CheckSignatureFrom(cert)
	}
	if err != nil {
		return nil, fmt.Errorf("load CA: %w: %s: %w", ErrCorrupt, filepath.Join(dir, CACertFile), err)
	}
	key, err := readKey(filepath.Join(dir, CAKeyFile), cert)
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	return &CA{ClusterID: id, Cert: cert, key: key}, nil
}

// caClusterID returns the cluster id of a cairn CA certificate, or an
// error saying why c is not one.
func caClusterID(c *x509.Certificate) (string, error) {
	if !c.IsCA || !c.BasicConstraintsValid {
		return "", errors.New("not a CA certificate")
	}
	if len(c.Subject.Organization) != 1 || c.Subject.Organization[0] != Organization {
		return "", fmt.Errorf("CA organization is %q, want [%q]", c.Subject.Organization, Organization)
	}
	id, ok := strings.CutPrefix(c.Subject.CommonName, caCNPrefix)
	if !ok || !validClusterID(id) {
		return "", fmt.Errorf("CA common name %q is not %q followed by a cluster id", c.Subject.CommonName, caCNPrefix)
	}
	return id, nil
}

func validClusterID(id string) bool {
	if len(id) != 32 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
