package tier

import (
	"context"
	"fmt"
	"net/url"
	"path"
	"strings"
)

// Open opens the tier a URL names and returns its bucket and the prefix
// of the repo in it:
//
//	s3://BUCKET[/PREFIX]   a bucket of an S3-compatible store (OpenS3: the
//	                       endpoint and credentials from the environment)
//	file:///DIR[/...]      a directory, on a shared file system mostly
//
// A URL holds no credentials: one with a user or password is refused, so
// that none is ever written into a record or a log.
func Open(ctx context.Context, raw string) (Bucket, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, "", fmt.Errorf("tier URL %q: %w", raw, err)
	}
	if u.User != nil {
		return nil, "", fmt.Errorf("tier URL %s://%s%s: credentials belong in the environment or a credentials file, not in the URL", u.Scheme, u.Host, u.Path)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, "", fmt.Errorf("tier URL %q: no query or fragment is taken", raw)
	}
	switch u.Scheme {
	case "s3":
		prefix := strings.Trim(u.Path, "/")
		if u.Host == "" {
			return nil, "", fmt.Errorf("tier URL %q: want s3://BUCKET[/PREFIX]", raw)
		}
		if prefix != "" {
			if err := checkKey(prefix); err != nil {
				return nil, "", fmt.Errorf("tier URL %q: %w", raw, err)
			}
		}
		b, err := OpenS3(ctx, S3Config{Bucket: u.Host})
		return b, prefix, err
	case "file":
		if u.Host != "" || !path.IsAbs(u.Path) || path.Clean(u.Path) != strings.TrimSuffix(u.Path, "/") && u.Path != "/" {
			return nil, "", fmt.Errorf("tier URL %q: want file:///ABSOLUTE/CLEAN/PATH", raw)
		}
		b, err := OpenFileBucket(path.Clean(u.Path))
		return b, "", err
	}
	return nil, "", fmt.Errorf("tier URL %q: the scheme must be s3:// or file://", raw)
}
