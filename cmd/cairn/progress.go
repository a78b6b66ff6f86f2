package main

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"cairn/internal/human"
	"cairn/internal/image"
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
	var mu sync.Mutex
	start := time.Now()
	drawn := false
	p = func(n, total int64) {
		mu.Lock()
		defer mu.Unlock()
		el := time.Since(start).Seconds()
		rate, amount := "", human.Bytes(n)
		if el > 0.05 {
			rate = human.Bytes(int64(float64(n)/el)) + "/s"
		}
		if unit != "" {
			amount = fmt.Sprintf("%d/%d %s", n, total, unit)
			if el > 0.05 {
				rate = fmt.Sprintf("%.0f %s/s", float64(n)/el, unit)
			}
		}
		bar := ""
		if total > 0 {
			const width = 30
			frac := min(float64(n)/float64(total), 1)
			fill := int(frac * width)
			bar = fmt.Sprintf("[%s%s] %3.0f%% ", strings.Repeat("=", fill), strings.Repeat(" ", width-fill), frac*100)
		}
		fmt.Fprintf(os.Stderr, "\r\033[K%s %s%s %s", label, bar, amount, rate)
		drawn = true
	}
	return p, func() {
		mu.Lock()
		defer mu.Unlock()
		if drawn {
			fmt.Fprint(os.Stderr, "\r\033[K")
		}
	}
}
