package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// IssueOptions tune [CA.Issue].
type IssueOptions struct {
	// IPs are added to the certificate as IP SANs, so that peers can reach
	// and verify it by address as well as by name.
	IPs []net.IP
	// Validity is how long the certificate is valid from now; zero means
	// DefaultLeafValidity.
	Validity time.Duration
	// NotBefore and NotAfter, when not zero, set the validity period
	// exactly and override Validity. They exist for tests (an expired
	// certificate) and for operators who need a fixed period.
	NotBefore, NotAfter time.Time
}

// Credentials are what one node, the coordinator or a client needs to take
// part in the cluster's mutual TLS: its leaf certificate and key and the
// CA certificate it trusts.
type Credentials struct {
	// Name, Role and ClusterID are read from the leaf certificate and CA;
	// a reload never changes them.
	Name      string
	Role      Role
	ClusterID string
	// CA is the cluster CA certificate, the content of ca.crt.
	CA *x509.Certificate

	dir  string                          // where LoadCredentials read them; "" for issued ones
	leaf atomic.Pointer[tls.Certificate] // node.crt and node.key, replaced by Reload
}

// Cert is the leaf certificate in use, the content of node.crt when the
// credentials were loaded or last reloaded.
func (c *Credentials) Cert() *x509.Certificate { return c.leaf.Load().Leaf }

// newCredentials puts a leaf and its key into credentials.
func newCredentials(name string, role Role, clusterID string, cert, ca *x509.Certificate, key *ecdsa.PrivateKey, dir string) *Credentials {
	c := &Credentials{Name: name, Role: role, ClusterID: clusterID, CA: ca, dir: dir}
	c.leaf.Store(&tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert})
	return c
}

// Issue makes credentials for name in the given role: a fresh P-256 key
// and a leaf certificate with CN=name, OU=role, O=cairn, name as its DNS SAN
// and opts.IPs as its IP SANs. A name that fails [ValidateName] gives an
// error wrapping [ErrInvalidName]; an unknown role one wrapping
// [ErrInvalidRole]. The certificate never outlives the CA.
func (ca *CA) Issue(name string, role Role, opts IssueOptions) (*Credentials, error) {
	if err := ValidateName(name); err != nil {
		return nil, fmt.Errorf("issue certificate: %w", err)
	}
	if !role.valid() {
		return nil, fmt.Errorf("issue certificate for %s: %w: %q", name, ErrInvalidRole, role)
	}
	now := time.Now()
	if now.After(ca.Cert.NotAfter) {
		return nil, fmt.Errorf("issue certificate for %s: cluster CA expired at %v", name, ca.Cert.NotAfter)
	}
	validity := opts.Validity
	if validity == 0 {
		validity = DefaultLeafValidity
	}
	if validity < 0 {
		return nil, fmt.Errorf("issue certificate for %s: negative validity %v", name, validity)
	}
	notBefore, notAfter := now.Add(-clockSkew), now.Add(validity)
	if !opts.NotBefore.IsZero() {
		notBefore = opts.NotBefore
	}
	if !opts.NotAfter.IsZero() {
		notAfter = opts.NotAfter
	}
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	if !notAfter.After(notBefore) {
		return nil, fmt.Errorf("issue certificate for %s: NotAfter %v is not after NotBefore %v", name, notAfter, notBefore)
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("issue certificate for %s: generate key: %w", name, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, fmt.Errorf("issue certificate for %s: %w", name, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Organization:       []string{Organization},
			OrganizationalUnit: []string{string(role)},
			CommonName:         name,
		},
		DNSNames:              []string{name},
		IPAddresses:           opts.IPs,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           role.extKeyUsage(),
		BasicConstraintsValid: true,
		IsCA:                  false,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("issue certificate for %s: sign: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("issue certificate for %s: parse: %w", name, err)
	}
	return newCredentials(name, role, ca.ClusterID, cert, ca.Cert, key, ""), nil
}

// Renew issues credentials for the same name, role and IP addresses as
// the leaf certificate old, which must be one of this CA's: a fresh key
// and a certificate valid for opts.Validity from now (IPs in opts are
// ignored). The old certificate may have expired; renewing is how a node
// that was off for a year comes back.
func (ca *CA) Renew(old *x509.Certificate, opts IssueOptions) (*Credentials, error) {
	name, role, err := leafIdentity(old)
	if err != nil {
		return nil, fmt.Errorf("renew certificate: %w: %w", ErrCorrupt, err)
	}
	if err := old.CheckSignatureFrom(ca.Cert); err != nil {
		return nil, fmt.Errorf("renew certificate of %s: it was not issued by the CA of cluster %s: %w: %w", name, ca.ClusterID, ErrWrongCluster, err)
	}
	opts.IPs = old.IPAddresses
	return ca.Issue(name, role, opts)
}

// Write writes the credentials to dir as node.crt, node.key (mode 0600) and
// ca.crt, creating dir (mode 0700) if missing. Each file is replaced
// atomically; existing credentials are overwritten, which is how they are
// renewed.
func (c *Credentials) Write(dir string) error {
	leaf := c.leaf.Load()
	keyPEM, err := encodeKey(leaf.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		return fmt.Errorf("write credentials for %s: %w", c.Name, err)
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return fmt.Errorf("write credentials for %s: %w", c.Name, err)
	}
	files := []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{KeyFile, keyPEM, keyMode},
		{CertFile, encodeCert(leaf.Leaf), certMode},
		{CACertFile, encodeCert(c.CA), certMode},
	}
	for _, f := range files {
		if err := writeFile(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return fmt.Errorf("write credentials for %s: %w", c.Name, err)
		}
	}
	return nil
}

// LoadCredentials reads the credentials [Credentials.Write] wrote in dir.
// A missing file gives an error wrapping [ErrNotFound]; a file that is not
// what cairn writes, or a key that does not match node.crt, one wrapping
// [ErrCorrupt]; a node.crt not signed by the CA in ca.crt one wrapping
// [ErrWrongCluster]. Expiry is not checked here: it is checked by the peer
// at every connection.
func LoadCredentials(dir string) (*Credentials, error) {
	caPath, certPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CertFile)
	ca, err := readCert(caPath)
	if err != nil {
		return nil, fmt.Errorf("load credentials: %w", err)
	}
	id, err := caClusterID(ca)
	if err != nil {
		return nil, fmt.Errorf("load credentials: %w: %s: %w", ErrCorrupt, caPath, err)
	}
	cert, err := readCert(certPath)
	if err != nil {
		return nil, fmt.Errorf("load credentials: %w", err)
	}
	name, role, err := leafIdentity(cert)
	if err != nil {
		return nil, fmt.Errorf("load credentials: %w: %s: %w", ErrCorrupt, certPath, err)
	}
	if err := cert.CheckSignatureFrom(ca); err != nil {
		return nil, fmt.Errorf("load credentials: %s was not issued by the CA of cluster %s in %s: %w: %w",
			certPath, id, caPath, ErrWrongCluster, err)
	}
	key, err := readKey(filepath.Join(dir, KeyFile), cert)
	if err != nil {
		return nil, fmt.Errorf("load credentials: %w", err)
	}
	return newCredentials(name, role, id, cert, ca, key, dir), nil
}

// Reload reads the credentials' directory again and, if it holds another
// certificate (renewed: `cairn node cert --renew`), presents that one at
// every handshake from now on, with no restart; connections already made
// go on. It tells whether the certificate changed. Credentials of another
// name, role or cluster, a certificate that has expired, or files that do
// not load (caught half-written: try again) give an error and leave the
// credentials in use as they are.
func (c *Credentials) Reload() (bool, error) {
	if c.dir == "" {
		return false, errors.New("reload credentials: not loaded from a directory")
	}
	n, err := LoadCredentials(c.dir)
	if err != nil {
		return false, fmt.Errorf("reload: %w", err)
	}
	if n.Name != c.Name || n.Role != c.Role || !n.CA.Equal(c.CA) {
		return false, fmt.Errorf("reload credentials: %s now holds those of %s %s of cluster %s, not %s %s of %s; kept the ones in use",
			c.dir, n.Role, n.Name, n.ClusterID, c.Role, c.Name, c.ClusterID)
	}
	cur, next := c.leaf.Load(), n.leaf.Load()
	if cur.Leaf.Equal(next.Leaf) {
		return false, nil
	}
	if time.Now().After(next.Leaf.NotAfter) {
		return false, fmt.Errorf("reload credentials: %s in %s expired at %s; kept the one in use (valid until %s)",
			CertFile, c.dir, next.Leaf.NotAfter.Format(time.RFC3339), cur.Leaf.NotAfter.Format(time.RFC3339))
	}
	c.leaf.Store(next)
	return true, nil
}

// leafIdentity returns the name and role in a cairn leaf certificate, or
// an error saying why c is not one.
func leafIdentity(c *x509.Certificate) (string, Role, error) {
	if c.IsCA {
		return "", "", errors.New("certificate is a CA, not a leaf")
	}
	if len(c.Subject.Organization) != 1 || c.Subject.Organization[0] != Organization {
		return "", "", fmt.Errorf("organization is %q, want [%q]", c.Subject.Organization, Organization)
	}
	name := c.Subject.CommonName
	if err := ValidateName(name); err != nil {
		return "", "", fmt.Errorf("common name: %w", err)
	}
	if len(c.Subject.OrganizationalUnit) != 1 {
		return "", "", fmt.Errorf("organizational units are %q, want one role", c.Subject.OrganizationalUnit)
	}
	role, err := ParseRole(c.Subject.OrganizationalUnit[0])
	if err != nil {
		return "", "", err
	}
	return name, role, nil
}

// tlsCertificate returns the certificate in use for a handshake, the
// chain being the leaf alone: peers already hold the CA.
func (c *Credentials) tlsCertificate() *tls.Certificate { return c.leaf.Load() }
