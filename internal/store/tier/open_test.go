package tier_test

import (
	"context"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store/tier"
)

func TestOpen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	b, prefix, err := tier.Open(ctx, "file://"+dir+"/ckpts")
	if err != nil || prefix != "" || b.String() != "file://"+dir+"/ckpts" {
		t.Fatalf("open file tier: %v, %q, %v", b, prefix, err)
	}
	for _, c := range []struct{ url, says string }{
		{"s3://key:secret@bucket/p", "credentials belong in the environment"},
		{"s3:///p", "want s3://BUCKET"},
		{"s3://bucket/a/../b", "invalid object key"},
		{"s3://bucket/p?x=1", "no query"},
		{"file://host/dir", "want file:///"},
		{"file://relative", "want file:///"},
		{"file:///a/../b", "want file:///"},
		{"gs://bucket", "must be s3:// or file://"},
		{"/just/a/path", "must be s3:// or file://"},
	} {
		_, _, err := tier.Open(ctx, c.url)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("open %q: %v, want an error saying %q", c.url, err, c.says)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("open %q: the error shows the secret: %v", c.url, err)
		}
	}
}
