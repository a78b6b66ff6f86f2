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
	notBefore, notAfter, err := ca.period(name, opts)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("issue certificate for %s: generate key: %w", name, err)
	}
	cert, err := ca.sign(name, role, opts.IPs, &key.PublicKey, notBefore, notAfter)
	if err != nil {
		return nil, err
	}
	return newCredentials(name, role, ca.ClusterID, cert, ca.Cert, key, ""), nil
}

// period is the validity period of a certificate for name that opts ask
// for: from now (less the clock skew allowed) for opts.Validity (or
// DefaultLeafValidity), or exactly opts' NotBefore and NotAfter, never
// beyond the CA.
func (ca *CA) period(name string, opts IssueOptions) (notBefore, notAfter time.Time, err error) {
	now := time.Now()
	if now.After(ca.Cert.NotAfter) {
		return notBefore, notAfter, fmt.Errorf("issue certificate for %s: cluster CA expired at %v", name, ca.Cert.NotAfter)
	}
	validity := opts.Validity
	if validity == 0 {
		validity = DefaultLeafValidity
	}
	if validity < 0 {
		return notBefore, notAfter, fmt.Errorf("issue certificate for %s: negative validity %v", name, validity)
	}
	notBefore, notAfter = now.Add(-clockSkew), now.Add(validity)
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
		return notBefore, notAfter, fmt.Errorf("issue certificate for %s: NotAfter %v is not after NotBefore %v", name, notAfter, notBefore)
	}
	return notBefore, notAfter, nil
}

// sign makes a leaf certificate of name and role, for pub, valid from
// notBefore to notAfter.
func (ca *CA) sign(name string, role Role, ips []net.IP, pub any, notBefore, notAfter time.Time) (*x509.Certificate, error) {
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
		IPAddresses:           ips,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           role.extKeyUsage(),
		BasicConstraintsValid: true,
		IsCA:                  false,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("issue certificate for %s: sign: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("issue certificate for %s: parse: %w", name, err)
	}
	return cert, nil
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

// RenewalRequest starts a renewal of c by another party that holds the
// CA (the coordinator, for an agent): a fresh key, which stays here, and
// a certificate request signed by it (DER), for [CA.SignRenewal]. What
// the new certificate says comes from the one c presents, not from the
// request.
func (c *Credentials) RenewalRequest() (csr []byte, key *ecdsa.PrivateKey, err error) {
	key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("renewal request: %w", err)
	}
	csr, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: c.Name}}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("renewal request: %w", err)
	}
	return csr, key, nil
}

// SignRenewal renews the certificate of a peer that proved it holds it
// (peer, as the TLS handshake verified it): a certificate with peer's
// name, role and IP addresses, for the key of csr (whose signature must
// hold: the requester has that key), valid as opts say from now. The
// request's own subject and extensions are ignored: a request grants
// nothing by itself.
func (ca *CA) SignRenewal(peer *x509.Certificate, csr []byte, opts IssueOptions) (*x509.Certificate, error) {
	name, role, err := leafIdentity(peer)
	if err != nil {
		return nil, fmt.Errorf("renew certificate: %w: %w", ErrUnauthenticated, err)
	}
	if err := peer.CheckSignatureFrom(ca.Cert); err != nil {
		return nil, fmt.Errorf("renew certificate of %s: %w: %w", name, ErrWrongCluster, err)
	}
	req, err := x509.ParseCertificateRequest(csr)
	if err != nil {
		return nil, fmt.Errorf("renew certificate of %s: request: %w", name, err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Errorf("renew certificate of %s: request not signed by its key: %w", name, err)
	}
	if _, ok := req.PublicKey.(*ecdsa.PublicKey); !ok {
		return nil, fmt.Errorf("renew certificate of %s: request for a %T key, want ECDSA", name, req.PublicKey)
	}
	notBefore, notAfter, err := ca.period(name, opts)
	if err != nil {
		return nil, err
	}
	return ca.sign(name, role, peer.IPAddresses, req.PublicKey, notBefore, notAfter)
}

// Install writes a renewed certificate and its key (from
// [Credentials.RenewalRequest]) into the credentials' directory and
// reloads them: the certificate must be for c's name, role and cluster,
// and match key.
func (c *Credentials) Install(cert *x509.Certificate, key *ecdsa.PrivateKey) error {
	if c.dir == "" {
		return errors.New("install renewed credentials: not loaded from a directory")
	}
	name, role, err := leafIdentity(cert)
	if err != nil || name != c.Name || role != c.Role {
		return fmt.Errorf("install renewed credentials: the certificate is not %s %s's (%s %s, %v)", c.Role, c.Name, role, name, err)
	}
	if err := cert.CheckSignatureFrom(c.CA); err != nil {
		return fmt.Errorf("install renewed credentials: %w: %w", ErrWrongCluster, err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return errors.New("install renewed credentials: the certificate is not for the key")
	}
	n := newCredentials(c.Name, c.Role, c.ClusterID, cert, c.CA, key, c.dir)
	if err := n.Write(c.dir); err != nil {
		return err
	}
	if _, err := c.Reload(); err != nil {
		return err
	}
	return nil
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
