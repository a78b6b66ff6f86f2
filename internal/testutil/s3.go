package testutil

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Weed is SeaweedFS's server, the real S3-compatible object store of the
// tests (scripts/setup.sh builds it from the Go module of the version it
// names).
const Weed = "/opt/cairn/bin/weed"

// S3Server is a SeaweedFS server (weed mini: master, volume, filer and S3
// gateway in one process) on loopback ports of its own, with its data in
// a temporary directory and two identities: one that may do anything
// (AccessKey, SecretKey) and one that may only read bucket "other"
// (DeniedKey, DeniedSecret), for tests of refused access. Nothing of it
// reaches beyond loopback (its telemetry is off). The test's cleanup
// kills it, by pid, and removes its directory.
type S3Server struct {
	Endpoint                string // http://127.0.0.1:PORT
	AccessKey, SecretKey    string
	DeniedKey, DeniedSecret string
	Dir                     string

	t       testing.TB
	args    []string
	sockets []string // what weed leaves in /tmp
	cmd     *exec.Cmd
	done    chan struct{}
}

// NewS3Server starts a SeaweedFS server and waits until its S3 gateway
// answers; without the binary the test fails, naming what to run.
func NewS3Server(t testing.TB) *S3Server {
	t.Helper()
	return NewS3ServerOn(t, "127.0.0.1")
}

// NewS3ServerOn is NewS3Server listening on ip instead of loopback: an
// address of the test's own, such as a local cluster's underlay gateway,
// which the agents in its nodes' network namespaces reach.
func NewS3ServerOn(t testing.TB, ip string) *S3Server {
	t.Helper()
	if _, err := os.Stat(Weed); err != nil {
		t.Fatalf("%s: %v (make setup builds SeaweedFS's weed, the S3 server of the tests)", Weed, err)
	}
	dir, err := os.MkdirTemp("", "cairn-s3-")
	if err != nil {
		t.Fatal(err)
	}
	s := &S3Server{t: t, Dir: dir, AccessKey: "cairn-test", SecretKey: "cairn-test-secret-0123456789",
		DeniedKey: "cairn-denied", DeniedSecret: "cairn-denied-secret-0123456789"}
	t.Cleanup(func() {
		s.Stop()
		os.RemoveAll(dir)
		// weed mini puts the unix sockets of its gRPC servers in /tmp,
		// named by their ports: ours.
		for _, p := range s.sockets {
			os.Remove(p)
		}
	})
	cfg := map[string]any{"identities": []map[string]any{
		{"name": "cairn", "credentials": []map[string]string{{"accessKey": s.AccessKey, "secretKey": s.SecretKey}},
			"actions": []string{"Admin", "Read", "List", "Tagging", "Write"}},
		{"name": "denied", "credentials": []map[string]string{{"accessKey": s.DeniedKey, "secretKey": s.DeniedSecret}},
			"actions": []string{"Read:other", "List:other"}},
	}}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "s3.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	ports := freePorts(t, 10)
	s.Endpoint = fmt.Sprintf("http://%s:%d", ip, ports[0])
	for _, g := range []struct {
		name string
		port int
	}{{"s3", ports[1]}, {"master", ports[3]}, {"volume", ports[5]}, {"filer", ports[7]}, {"admin", ports[9]}} {
		s.sockets = append(s.sockets, fmt.Sprintf("/tmp/seaweedfs-%s-grpc-%d.sock", g.name, g.port))
	}
	s.args = []string{"mini", "-dir=" + data, "-ip=" + ip, "-ip.bind=" + ip,
		"-s3.config=" + filepath.Join(dir, "s3.json"), "-s3.autoCreateBucket=false",
		fmt.Sprintf("-s3.port=%d", ports[0]), fmt.Sprintf("-s3.port.grpc=%d", ports[1]),
		fmt.Sprintf("-master.port=%d", ports[2]), fmt.Sprintf("-master.port.grpc=%d", ports[3]),
		fmt.Sprintf("-volume.port=%d", ports[4]), fmt.Sprintf("-volume.port.grpc=%d", ports[5]),
		fmt.Sprintf("-filer.port=%d", ports[6]), fmt.Sprintf("-filer.port.grpc=%d", ports[7]),
		"-filer.localSocket=" + filepath.Join(dir, "filer.sock"), "-s3.localSocket=" + filepath.Join(dir, "s3.sock"),
		fmt.Sprintf("-admin.port=%d", ports[8]), fmt.Sprintf("-admin.port.grpc=%d", ports[9]), "-admin.port.legacy=0",
		"-admin.dataDir=" + filepath.Join(dir, "admin"),
		"-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
		"-master.telemetry=false", "-master.volumeSizeLimitMB=256"}
	s.Start()
	return s
}

// Start starts the server (again, on the same ports and data) and waits
// until its S3 gateway answers.
func (s *S3Server) Start() {
	t := s.t
	t.Helper()
	log, err := os.OpenFile(filepath.Join(s.Dir, "weed.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	s.cmd = exec.Command(Weed, s.args...)
	s.cmd.Dir = s.Dir
	s.cmd.Stdout, s.cmd.Stderr = log, log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(s.cmd, s.done)
	deadline := time.Now().Add(90 * time.Second)
	for {
		if err := s.ready(); err == nil {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("SeaweedFS's S3 gateway at %s did not answer within 90s: %v\n%s", s.Endpoint, err, s.logTail())
		}
		select {
		case <-s.done:
			t.Fatalf("SeaweedFS exited: %v\n%s", s.cmd.ProcessState, s.logTail())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ready lists the buckets with the full identity.
func (s *S3Server) ready() error {
	c, err := s.Client(s.AccessKey, s.SecretKey)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.ListBuckets(ctx)
	return err
}

// Rebind restarts the server, its data kept, listening on ip instead:
// where the nodes of another local cluster reach it (a node reaches only
// its own cluster's gateway).
func (s *S3Server) Rebind(ip string) {
	s.t.Helper()
	s.Stop()
	old := strings.TrimPrefix(s.Endpoint, "http://")
	_, port, _ := strings.Cut(old, ":")
	for i, a := range s.args {
		switch {
		case strings.HasPrefix(a, "-ip="):
			s.args[i] = "-ip=" + ip
		case strings.HasPrefix(a, "-ip.bind="):
			s.args[i] = "-ip.bind=" + ip
		}
	}
	s.Endpoint = "http://" + ip + ":" + port
	s.Start()
}

// Stop kills the server, by pid, and waits for it to end.
func (s *S3Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// Client is a client of the server signing with the given keys.
func (s *S3Server) Client(key, secret string) (*minio.Client, error) {
	return minio.New(strings.TrimPrefix(s.Endpoint, "http://"), &minio.Options{
		Creds:     credentials.NewStaticV4(key, secret, ""),
		Transport: &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext},
	})
}

// MakeBucket creates bucket name, failing t if it cannot.
func (s *S3Server) MakeBucket(t testing.TB, name string) {
	t.Helper()
	c, err := s.Client(s.AccessKey, s.SecretKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MakeBucket(context.Background(), name, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("make bucket %s: %v", name, err)
	}
}

// Env is the environment a client of the server takes its endpoint and
// full credentials from.
func (s *S3Server) Env() []string {
	return []string{"AWS_ENDPOINT_URL=" + s.Endpoint, "AWS_ACCESS_KEY_ID=" + s.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s.SecretKey}
}

func (s *S3Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "weed.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// freePorts returns n distinct loopback TCP ports free at the time of
// the call.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}
