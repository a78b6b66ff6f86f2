package pki_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/cairn-hpc/cairn/internal/pki"
)

// approx reports whether got is within a minute of want.
func approx(got, want time.Time) bool {
	d := got.Sub(want)
	return -time.Minute < d && d < time.Minute
}

func TestInit(t *testing.T) {
	tests := []struct {
		name     string
		opts     pki.InitOptions
		validity time.Duration
	}{
		{"default validity", pki.InitOptions{}, 10 * 365 * 24 * time.Hour},
		{"one day", pki.InitOptions{Validity: 24 * time.Hour}, 24 * time.Hour},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ca")
			start := time.Now()
			ca, err := pki.Init(dir, tc.opts)
			if err != nil {
				t.Fatalf("Init: %v", err)
			}
			if len(ca.ClusterID) != 32 {
				t.Errorf("cluster id %q, want 32 hex digits", ca.ClusterID)
			}
			c := ca.Cert
			type summary struct {
				O, OU          []string
				CN             string
				IsCA, PathZero bool
				MaxPathLen     int
			}
			want := summary{O: []string{"cairn"}, CN: "cairn cluster " + ca.ClusterID, IsCA: true, PathZero: true}
			got := summary{c.Subject.Organization, c.Subject.OrganizationalUnit, c.Subject.CommonName, c.IsCA, c.MaxPathLenZero, c.MaxPathLen}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("CA certificate mismatch (-want +got):\n%s", diff)
			}
			if !approx(c.NotAfter, start.Add(tc.validity)) {
				t.Errorf("NotAfter %v, want about %v", c.NotAfter, start.Add(tc.validity))
			}
			if !c.NotBefore.Before(start) {
				t.Errorf("NotBefore %v is not before %v", c.NotBefore, start)
			}

			modes := map[string]fs.FileMode{dir: fs.ModeDir | 0o700, "ca.crt": 0o644, "ca.key": 0o600}
			for name, want := range modes {
				p := name
				if name != dir {
					p = filepath.Join(dir, name)
				}
				fi, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode() != want {
					t.Errorf("%s: mode %v, want %v", name, fi.Mode(), want)
				}
			}

			loaded, err := pki.Load(dir)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if loaded.ClusterID != ca.ClusterID || !loaded.Cert.Equal(ca.Cert) {
				t.Errorf("Load gave cluster %s, want %s as written by Init", loaded.ClusterID, ca.ClusterID)
			}
			// The loaded key signs: credentials it issues verify against the CA.
			creds := issue(t, loaded, "node1", pki.Agent, pki.IssueOptions{})
			if err := creds.Cert().CheckSignatureFrom(ca.Cert); err != nil {
				t.Errorf("certificate issued by the loaded CA: %v", err)
			}
		})
	}
}

func TestInitRandomClusterID(t *testing.T) {
	a, b := newCluster(t), newCluster(t)
	if a.ca.ClusterID == b.ca.ClusterID {
		t.Errorf("two clusters share the id %s", a.ca.ClusterID)
	}
}

func TestInitRefusesToOverwrite(t *testing.T) {
	tests := []struct {
		name    string
		present []string // files left by an earlier Init
	}{
		{"whole CA", []string{"ca.crt", "ca.key"}},
		{"key only", []string{"ca.key"}},
		{"certificate only", []string{"ca.crt"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			first, err := pki.Init(dir, pki.InitOptions{})
			if err != nil {
				t.Fatalf("Init: %v", err)
			}
			for _, f := range []string{"ca.crt", "ca.key"} {
				if !slices.Contains(tc.present, f) {
					if err := os.Remove(filepath.Join(dir, f)); err != nil {
						t.Fatal(err)
					}
				}
			}
			before := readFiles(t, dir)
			if _, err := pki.Init(dir, pki.InitOptions{}); !errors.Is(err, pki.ErrExists) {
				t.Fatalf("second Init error %v, want ErrExists", err)
			}
			if diff := cmp.Diff(before, readFiles(t, dir)); diff != "" {
				t.Errorf("refused Init changed the directory (-before +after):\n%s", diff)
			}

			second, err := pki.Init(dir, pki.InitOptions{Force: true})
			if err != nil {
				t.Fatalf("Init with Force: %v", err)
			}
			if second.ClusterID == first.ClusterID {
				t.Errorf("Init with Force kept the cluster id %s", first.ClusterID)
			}
			loaded, err := pki.Load(dir)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if loaded.ClusterID != second.ClusterID {
				t.Errorf("Load gave cluster %s, want the new %s", loaded.ClusterID, second.ClusterID)
			}
		})
	}
}

func TestInitNegativeValidity(t *testing.T) {
	if _, err := pki.Init(t.TempDir(), pki.InitOptions{Validity: -time.Hour}); err == nil {
		t.Error("Init with a negative validity succeeded")
	}
}

func TestLoadErrors(t *testing.T) {
	other, err := pki.Init(t.TempDir(), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	otherDir := t.TempDir()
	if _, err := pki.Init(otherDir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	leaf := t.TempDir()
	if err := issue(t, other, "node1", pki.Agent, pki.IssueOptions{}).Write(leaf); err != nil {
		t.Fatal(err)
	}

	remove := func(name string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	write := func(name, data string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	copyFrom := func(src, name string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			data, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			write(name, string(data))(t, dir)
		}
	}
	truncate := func(name string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			data, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			write(name, string(data[:len(data)/2]))(t, dir)
		}
	}

	tests := []struct {
		name    string
		damage  func(t *testing.T, dir string)
		wantErr error
	}{
		{"no certificate", remove("ca.crt"), pki.ErrNotFound},
		{"no key", remove("ca.key"), pki.ErrNotFound},
		{"empty certificate", write("ca.crt", ""), pki.ErrCorrupt},
		{"garbage certificate", write("ca.crt", "not a certificate\n"), pki.ErrCorrupt},
		{"truncated certificate", truncate("ca.crt"), pki.ErrCorrupt},
		{"garbage in PEM", write("ca.crt", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), pki.ErrCorrupt},
		{"key in certificate file", copyFrom(filepath.Join(otherDir, "ca.key"), "ca.crt"), pki.ErrCorrupt},
		{"leaf as CA", copyFrom(filepath.Join(leaf, "node.crt"), "ca.crt"), pki.ErrCorrupt},
		{"garbage key", write("ca.key", "not a key\n"), pki.ErrCorrupt},
		{"truncated key", truncate("ca.key"), pki.ErrCorrupt},
		{"key of another CA", copyFrom(filepath.Join(otherDir, "ca.key"), "ca.key"), pki.ErrCorrupt},
		{"certificate of another CA", copyFrom(filepath.Join(otherDir, "ca.crt"), "ca.crt"), pki.ErrCorrupt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
				t.Fatal(err)
			}
			tc.damage(t, dir)
			ca, err := pki.Load(dir)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Load error %v, want %v", err, tc.wantErr)
			}
			if ca != nil {
				t.Errorf("Load returned a CA with error %v", err)
			}
		})
	}

	t.Run("missing directory", func(t *testing.T) {
		_, err := pki.Load(filepath.Join(t.TempDir(), "nope"))
		if !errors.Is(err, pki.ErrNotFound) || !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Load error %v, want ErrNotFound and fs.ErrNotExist", err)
		}
	})
}

// readFiles returns the names and contents of the files in dir.
func readFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[string]string)
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = string(data)
	}
	return m
}
