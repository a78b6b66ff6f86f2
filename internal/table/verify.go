package table

import (
	"fmt"
	"io"

	"github.com/cairn-hpc/cairn/internal/image"
)

// The lines of cairn verify: every problem starts with BAD.

// Stray writes a stray entry of the catalog.
func Stray(w io.Writer, s image.Stray) { fmt.Fprintf(w, "BAD  catalog: %s: %s\n", s.Path, s.Reason) }

// Verified writes a checkpoint's verification: ok, or BAD and why.
func Verified(w io.Writer, r image.VerifyResult) {
	if r.OK {
		fmt.Fprintf(w, "ok   %s\n", r.Checkpoint)
	} else {
		fmt.Fprintf(w, "BAD  %s: %s\n", r.Checkpoint, r.Error)
	}
}

// Store writes the store's check: every problem, or ok and what it holds.
func Store(w io.Writer, st image.StoreReport) {
	for _, p := range st.Problems {
		fmt.Fprintf(w, "BAD  store: %s\n", p)
	}
	if len(st.Problems) == 0 {
		fmt.Fprintf(w, "ok   store: %d packs, %d chunks, %d manifests\n", st.Packs, st.Chunks, st.Manifests)
	}
}
