package catalog_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/catalog"
)

// testContext returns a context that ends with the test or after a
// minute, whichever is first.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// startEmbedded starts etcd in dir and closes it when the test ends.
func startEmbedded(t *testing.T, dir string) *catalog.Embedded {
	t.Helper()
	start := time.Now()
	e, err := catalog.StartEmbedded(testContext(t), catalog.EmbeddedOptions{Dir: dir, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("StartEmbedded: %v", err)
	}
	t.Logf("embedded etcd started in %v at %v", time.Since(start).Round(time.Millisecond), e.Endpoints())
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Embedded.Close: %v", err)
		}
	})
	return e
}

// open opens a Catalog on e and closes it when the test ends (before e is
// closed, cleanups running last-in first-out).
func open(t *testing.T, e *catalog.Embedded) *catalog.Catalog {
	t.Helper()
	c, err := catalog.Open(testContext(t), catalog.Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Catalog.Close: %v", err)
		}
	})
	return c
}

// newCatalog starts an embedded etcd in a temporary directory and opens a
// Catalog on it.
func newCatalog(t *testing.T) *catalog.Catalog {
	t.Helper()
	return open(t, startEmbedded(t, t.TempDir()))
}

// nextEvent returns the next event from ch, failing the test if none comes
// within d.
func nextEvent[E any](t *testing.T, ch <-chan E, d time.Duration) E {
	t.Helper()
	select {
	case e, ok := <-ch:
		if !ok {
			t.Fatalf("channel closed, want an event")
		}
		return e
	case <-time.After(d):
		t.Fatalf("no event within %v", d)
	}
	panic("unreachable")
}
