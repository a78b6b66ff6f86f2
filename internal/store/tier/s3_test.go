package tier_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/cairn-hpc/cairn/internal/store/tier"
	"github.com/cairn-hpc/cairn/internal/store/tier/tiertest"
	"github.com/cairn-hpc/cairn/internal/testutil"
)

// s3Buckets starts one real S3 server (SeaweedFS) for the test and opens
// a new bucket of it for each call.
func s3Buckets(t *testing.T) func(t *testing.T) tier.Bucket {
	srv := testutil.NewS3Server(t)
	var n atomic.Int64
	return func(t *testing.T) tier.Bucket {
		name := fmt.Sprintf("bucket-%d", n.Add(1))
		srv.MakeBucket(t, name)
		b, err := tier.OpenS3(context.Background(), tier.S3Config{Endpoint: srv.Endpoint, Bucket: name,
			Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, "")})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

func TestS3Bucket(t *testing.T) {
	tiertest.Run(t, s3Buckets(t))
}

// TestS3Repo runs a flush, a second flush of a changed image, fetches and
// a prune against the real server.
func TestS3Repo(t *testing.T) {
	open := s3Buckets(t)
	t.Run("FlushFetch", func(t *testing.T) { testFlushFetch(t, open) })
	t.Run("Prune", func(t *testing.T) { testPrune(t, open) })
}

// TestS3Errors: an unreachable server, refused credentials and a missing
// bucket each give their own error, and none shows the secret.
func TestS3Errors(t *testing.T) {
	ctx := context.Background()
	srv := testutil.NewS3Server(t)
	srv.MakeBucket(t, "ckpts")
	open := func(bucket, key, secret string) error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, err := tier.OpenS3(ctx, tier.S3Config{Endpoint: srv.Endpoint, Bucket: bucket, Creds: credentials.NewStaticV4(key, secret, "")})
		if err != nil && (strings.Contains(err.Error(), srv.SecretKey) || strings.Contains(err.Error(), srv.DeniedSecret)) {
			t.Errorf("the error shows a secret: %v", err)
		}
		return err
	}
	if err := open("ckpts", srv.AccessKey, srv.SecretKey); err != nil {
		t.Fatal(err)
	}
	if err := open("ckpts", srv.AccessKey, "wrong-secret-0123456789"); !errors.Is(err, tier.ErrDenied) {
		t.Errorf("wrong secret: %v, want ErrDenied", err)
	}
	if err := open("ckpts", srv.DeniedKey, srv.DeniedSecret); !errors.Is(err, tier.ErrDenied) {
		t.Errorf("a key without rights on the bucket: %v, want ErrDenied", err)
	}
	if err := open("nosuch", srv.AccessKey, srv.SecretKey); !errors.Is(err, tier.ErrNotExist) {
		t.Errorf("a missing bucket: %v, want ErrNotExist", err)
	}
	// A bucket opened, then its server gone.
	b, err := tier.OpenS3(ctx, tier.S3Config{Endpoint: srv.Endpoint, Bucket: "ckpts", Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := b.Put(cctx, "x", []byte("x")); !errors.Is(err, tier.ErrUnreachable) {
		t.Errorf("put with the server gone: %v, want ErrUnreachable", err)
	}
	if err := open("ckpts", srv.AccessKey, srv.SecretKey); !errors.Is(err, tier.ErrUnreachable) {
		t.Errorf("open with the server gone: %v, want ErrUnreachable", err)
	}
}
