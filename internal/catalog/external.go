package catalog

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
)

// TLSFiles are the PEM files of a client of an etcd cluster reached over
// TLS: CA verifies the servers ("" means the system's roots); Cert and
// Key, both or neither, are the client's certificate and key.
type TLSFiles struct {
	CA, Cert, Key string
}

func (f TLSFiles) empty() bool { return f.CA == "" && f.Cert == "" && f.Key == "" }

// ExternalConfig returns the Config to Open an etcd cluster that is not
// embedded, at endpoints, with the credentials in files. Endpoints are
// either all https:// (or unixs://), which are verified with files, or
// all plain: unix:// (a socket, guarded by its directory's permissions)
// or http:// to a loopback address. Plain http:// to any other host is
// refused: the catalog holds the jobs' command lines, which run as root.
// So are credentials given for plain endpoints, which would not use them.
func ExternalConfig(endpoints []string, files TLSFiles) (Config, error) {
	if len(endpoints) == 0 {
		return Config{}, errors.New("etcd: no endpoints")
	}
	if (files.Cert == "") != (files.Key == "") {
		return Config{}, errors.New("etcd: a client certificate needs its key, and a key its certificate")
	}
	var secure, plain []string
	for _, ep := range endpoints {
		u, err := url.Parse(ep)
		if err != nil {
			return Config{}, fmt.Errorf("etcd endpoint %q: %w", ep, err)
		}
		switch u.Scheme {
		case "https", "unixs":
			secure = append(secure, ep)
		case "unix":
			plain = append(plain, ep)
		case "http":
			if !loopback(u.Hostname()) {
				return Config{}, fmt.Errorf("etcd endpoint %s: plain http to a host other than this one; use https:// with a CA and a client certificate", ep)
			}
			plain = append(plain, ep)
		default:
			return Config{}, fmt.Errorf("etcd endpoint %q: want https://HOST:PORT, http://127.0.0.1:PORT or unix:///PATH", ep)
		}
	}
	switch {
	case len(secure) > 0 && len(plain) > 0:
		return Config{}, fmt.Errorf("etcd endpoints %s and %s: all TLS or none", secure[0], plain[0])
	case len(plain) > 0 && !files.empty():
		return Config{}, fmt.Errorf("etcd endpoint %s is not TLS, but TLS credentials were given", plain[0])
	case len(plain) > 0:
		return Config{Endpoints: endpoints}, nil
	}
	cfg, err := clientTLS(files)
	if err != nil {
		return Config{}, err
	}
	return Config{Endpoints: endpoints, TLS: cfg}, nil
}

// loopback reports whether host names this machine only.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func clientTLS(files TLSFiles) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if files.CA != "" {
		pem, err := os.ReadFile(files.CA)
		if err != nil {
			return nil, fmt.Errorf("etcd CA: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcd CA %s: no PEM certificate in it", files.CA)
		}
	}
	if files.Cert != "" {
		cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
		if err != nil {
			return nil, fmt.Errorf("etcd client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
