package tier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Bucket is a Bucket in an S3-compatible object store (AWS S3, Ceph
// RGW, MinIO, SeaweedFS), through minio-go.
type S3Bucket struct {
	c      *minio.Client
	bucket string
	name   string // s3://bucket, for messages
}

// S3Config says where a bucket is and how to sign requests. Credentials
// are not part of it: they come from the environment or a file
// (S3Credentials), never from a URL, a record or a log.
type S3Config struct {
	// Endpoint is the server's URL: https://s3.amazonaws.com when empty,
	// else AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (http:// for a server
	// without TLS).
	Endpoint string
	Bucket   string
	// Region is AWS_REGION or AWS_DEFAULT_REGION when empty; servers other
	// than AWS mostly ignore it.
	Region string
	// Creds sign the requests; S3Credentials() when nil.
	Creds *credentials.Credentials
}

// S3Credentials are the usual ones, in the usual order: the environment
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), then the
// shared credentials file (AWS_SHARED_CREDENTIALS_FILE or
// ~/.aws/credentials, profile AWS_PROFILE or "default").
func S3Credentials() *credentials.Credentials {
	return credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{},
		&credentials.FileAWSCredentials{},
	})
}

// OpenS3 returns the bucket cfg names, after checking that it exists and
// that the credentials may use it: an unreachable server gives an error
// matching ErrUnreachable, refused credentials one matching ErrDenied, a
// missing bucket one matching ErrNotExist.
func OpenS3(ctx context.Context, cfg S3Config) (*S3Bucket, error) {
	if cfg.Endpoint == "" {
		cfg.Endpoint = firstEnv("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = "https://s3.amazonaws.com"
	}
	if cfg.Region == "" {
		cfg.Region = firstEnv("AWS_REGION", "AWS_DEFAULT_REGION")
	}
	if cfg.Creds == nil {
		cfg.Creds = S3Credentials()
	}
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.User != nil {
		return nil, fmt.Errorf("s3 endpoint %q: want http(s)://host[:port], without a path or credentials", cfg.Endpoint)
	}
	c, err := minio.New(u.Host, &minio.Options{
		Creds:  cfg.Creds,
		Secure: u.Scheme == "https",
		Region: cfg.Region,
	})
	if err != nil {
		return nil, fmt.Errorf("s3 endpoint %s: %w", u.Host, err)
	}
	b := &S3Bucket{c: c, bucket: cfg.Bucket, name: "s3://" + cfg.Bucket}
	ok, err := c.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("open %s at %s: %w", b.name, u.Host, b.err(err))
	}
	if !ok {
		return nil, fmt.Errorf("open %s at %s: %w: no such bucket (create it first)", b.name, u.Host, ErrNotExist)
	}
	return b, nil
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// err classifies an error of the client: a missing object, refused
// credentials, an unreachable server.
func (b *S3Bucket) err(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	resp := minio.ToErrorResponse(err)
	switch resp.Code {
	case minio.NoSuchKey, "NotFound":
		return fmt.Errorf("%w: %w", ErrNotExist, err)
	case "InvalidRange":
		return fmt.Errorf("%w: %w", ErrShort, err)
	case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "AllAccessDisabled":
		return fmt.Errorf("%w: %w", ErrDenied, err)
	}
	if resp.StatusCode == 403 {
		return fmt.Errorf("%w: %w", ErrDenied, err)
	}
	var ne net.Error
	var ue *url.Error
	if errors.As(err, &ne) || errors.As(err, &ue) {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	return err
}

func (b *S3Bucket) String() string { return b.name }

func (b *S3Bucket) Put(ctx context.Context, key string, data []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	_, err := b.c.PutObject(ctx, b.bucket, key, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{
		ContentType:      "application/octet-stream",
		DisableMultipart: true, // objects are at most a pack: one request
	})
	if err != nil {
		return fmt.Errorf("put %s/%s: %w", b, key, b.err(err))
	}
	return nil
}

func (b *S3Bucket) Get(ctx context.Context, key string) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	return b.get(ctx, key, minio.GetObjectOptions{}, -1)
}

// get reads an object, or the range opts sets of n bytes (n < 0: whole).
func (b *S3Bucket) get(ctx context.Context, key string, opts minio.GetObjectOptions, n int64) ([]byte, error) {
	o, err := b.c.GetObject(ctx, b.bucket, key, opts)
	if err != nil {
		return nil, fmt.Errorf("get %s/%s: %w", b, key, b.err(err))
	}
	defer o.Close()
	var buf []byte
	if n >= 0 {
		buf = make([]byte, n)
		_, err = io.ReadFull(o, buf)
	} else {
		buf, err = io.ReadAll(o)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s/%s: %w", b, key, b.err(err))
	}
	return buf, nil
}

func (b *S3Bucket) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if off < 0 || n < 0 {
		return nil, fmt.Errorf("get %s/%s: range %d+%d", b, key, off, n)
	}
	if n == 0 {
		// No range of zero bytes in HTTP: check the object is there and
		// the offset inside it.
		st, err := b.c.StatObject(ctx, b.bucket, key, minio.StatObjectOptions{})
		if err != nil {
			return nil, fmt.Errorf("get %s/%s: %w", b, key, b.err(err))
		}
		if off > st.Size {
			return nil, fmt.Errorf("get %s/%s: range %d+0 outside its %d bytes: %w", b, key, off, st.Size, ErrShort)
		}
		return []byte{}, nil
	}
	var opts minio.GetObjectOptions
	if err := opts.SetRange(off, off+n-1); err != nil {
		return nil, err
	}
	buf, err := b.get(ctx, key, opts, n)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("get %s/%s: range %d+%d outside the object: %w: %w", b, key, off, n, ErrShort, err)
	}
	return buf, err
}

func (b *S3Bucket) List(ctx context.Context, prefix string) ([]Object, error) {
	var out []Object
	for o := range b.c.ListObjects(ctx, b.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, fmt.Errorf("list %s/%s: %w", b, prefix, b.err(o.Err))
		}
		if strings.HasSuffix(o.Key, "/") {
			continue // a directory marker some servers list
		}
		out = append(out, Object{Key: o.Key, Size: o.Size})
	}
	return out, nil
}

func (b *S3Bucket) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := b.c.RemoveObject(ctx, b.bucket, key, minio.RemoveObjectOptions{}); err != nil {
		if err := b.err(err); !errors.Is(err, ErrNotExist) {
			return fmt.Errorf("delete %s/%s: %w", b, key, err)
		}
	}
	return nil
}
