package human

import (
	"fmt"
	"strconv"
)

// ParseBytes reads a byte count with an optional K, M or G suffix (powers
// of 1024): 50M.
func ParseBytes(s string) (int64, error) {
	mult := int64(1)
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'k', 'K':
			mult, s = 1<<10, s[:n-1]
		case 'm', 'M':
			mult, s = 1<<20, s[:n-1]
		case 'g', 'G':
			mult, s = 1<<30, s[:n-1]
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a size such as 50M", s)
	}
	return v * mult, nil
}
