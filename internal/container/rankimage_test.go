package container_test

import (
	"testing"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/image"
)

// TestRankImage: an image of a container attached to a job network is a
// rank's (the cluster's retention governs it); one of a container of its
// own is not; one whose config does not parse is kept as a rank's.
func TestRankImage(t *testing.T) {
	for cfg, want := range map[string]bool{
		`{"name":"ring.0","args":["/ring"],"net":{"netns":"/run/netns/cairn-r","addr":"10.9.0.2"},"addr":"10.9.0.2"}`: true,
		`{"name":"app","args":["/app"],"addr":"10.88.0.5"}`:                                                           false,
		`{"name":`: true,
	} {
		if got := container.RankImage(&image.Record{Config: []byte(cfg)}); got != want {
			t.Errorf("RankImage(%s) = %v, want %v", cfg, got, want)
		}
	}
}
