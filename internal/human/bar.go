package human

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Bar draws a progress bar with its rate on one line of w, a terminal,
// redrawn at every call of progress with the amount done of total (bytes,
// or counts of unit when unit is not ""); done clears the line. They may
// be called from several goroutines.
func Bar(w io.Writer, label, unit string) (progress func(n, total int64), done func()) {
	var mu sync.Mutex
	start := time.Now()
	drawn := false
	progress = func(n, total int64) {
		mu.Lock()
		defer mu.Unlock()
		el := time.Since(start).Seconds()
		rate, amount := "", Bytes(n)
		if el > 0.05 {
			rate = Bytes(int64(float64(n)/el)) + "/s"
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
		fmt.Fprintf(w, "\r\033[K%s %s%s %s", label, bar, amount, rate)
		drawn = true
	}
	return progress, func() {
		mu.Lock()
		defer mu.Unlock()
		if drawn {
			fmt.Fprint(w, "\r\033[K")
		}
	}
}
