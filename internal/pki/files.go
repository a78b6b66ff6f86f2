package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cairn-hpc/cairn/internal/durable"
)

// File names, inside a CA directory ([Init], [Load]) and a credentials
// directory ([Credentials.Write], [LoadCredentials]).
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
	CertFile   = "node.crt"
	KeyFile    = "node.key"
)

// File modes: keys are readable by their owner only.
const (
	certMode = 0o644
	keyMode  = 0o600
	dirMode  = 0o700
)

const (
	pemCertificate = "CERTIFICATE"
	pemPrivateKey  = "PRIVATE KEY"
)

func encodeCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: c.Raw})
}

func encodeKey(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("encode private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der}), nil
}

// readPEM reads the single PEM block of type typ in path. A missing file
// gives ErrNotFound; anything else that is not one such block gives
// ErrCorrupt.
func readPEM(path, typ string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	if err != nil {
		return nil, err
	}
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%w: %s: no PEM block", ErrCorrupt, path)
	}
	if block.Type != typ {
		return nil, fmt.Errorf("%w: %s: PEM block is %q, want %q", ErrCorrupt, path, block.Type, typ)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("%w: %s: trailing data after the %s block", ErrCorrupt, path, typ)
	}
	return block.Bytes, nil
}

func readCert(path string) (*x509.Certificate, error) {
	der, err := readPEM(path, pemCertificate)
	if err != nil {
		return nil, err
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
	}
	return c, nil
}

// readKey reads an ECDSA private key and checks that it belongs to cert.
func readKey(path string, cert *x509.Certificate) (*ecdsa.PrivateKey, error) {
	der, err := readPEM(path, pemPrivateKey)
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%w: %s: key is %T, want ECDSA", ErrCorrupt, path, k)
	}
	if !ek.PublicKey.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("%w: %s does not match the certificate's public key", ErrCorrupt, path)
	}
	return ek, nil
}

// writeFile replaces path with data atomically; see durable.WriteFile.
func writeFile(path string, data []byte, mode fs.FileMode) error {
	return durable.WriteFile(path, data, mode)
}

func exists(dir string, names ...string) (string, error) {
	for _, n := range names {
		p := filepath.Join(dir, n)
		_, err := os.Lstat(p)
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
	}
	return "", nil
}
