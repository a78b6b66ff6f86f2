package main

import (
	"os"

	"github.com/cairn-hpc/cairn/internal/human"
	"github.com/cairn-hpc/cairn/internal/image"
)

// progressBar returns an image.Progress that draws a bar with the rate on
// stderr when stderr is a terminal, and nil (no output) otherwise or when
// quiet: scripts and --json get clean output.
func progressBar(label string, quiet bool) (p image.Progress, done func()) {
	return progressBarOf(label, quiet, "")
}

// progressBarOf is progressBar for counts of unit ("chunks") instead of
// bytes.
func progressBarOf(label string, quiet bool, unit string) (p image.Progress, done func()) {
	if quiet || !isTerminal(os.Stderr) {
		return nil, func() {}
	}
	return human.Bar(os.Stderr, label, unit)
}
