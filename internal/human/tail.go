package human

import (
	"bytes"
	"io"
)

// TailWriter keeps the last N lines written to it (a last line without
// its newline counts as one) and writes them to W on Flush: what `tail
// -n N` prints. N 0 keeps nothing.
type TailWriter struct {
	W     io.Writer
	N     int
	lines [][]byte // the last N complete lines, oldest first
	part  []byte   // a line not yet ended
}

func (t *TailWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			t.part = append(t.part, p...)
			break
		}
		line := append(t.part, p[:i+1]...)
		t.part = nil
		p = p[i+1:]
		if t.N == 0 {
			continue
		}
		if len(t.lines) == t.N {
			t.lines = t.lines[1:]
		}
		t.lines = append(t.lines, line)
	}
	return n, nil
}

// Flush writes the kept lines to W.
func (t *TailWriter) Flush() error {
	lines := t.lines
	if len(t.part) > 0 && t.N > 0 {
		if len(lines) == t.N {
			lines = lines[1:]
		}
		lines = append(lines, t.part)
	}
	for _, l := range lines {
		if _, err := t.W.Write(l); err != nil {
			return err
		}
	}
	t.lines, t.part = nil, nil
	return nil
}
