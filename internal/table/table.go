package table

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"
)

// New returns a writer that aligns tab-separated columns, two spaces
// apart; Flush writes them. Control characters in the cells are written
// escaped (Printable): a name or message from outside cannot move the
// cursor, erase a line or forge one.
func New(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(escaping{w}, 0, 4, 2, ' ', 0)
}

// escaping writes what is written to it with every control character
// but newline escaped.
type escaping struct{ w io.Writer }

func (e escaping) Write(p []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(p), "\n") {
		body, nl := strings.CutSuffix(line, "\n")
		out := Printable(body)
		if nl {
			out += "\n"
		}
		if _, err := io.WriteString(e.w, out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Printable is s with its control characters (C0 but tab, C1, and the
// Unicode marks that reorder text) written as Go escapes: text from
// outside, shown on a terminal, shows as it is.
func Printable(s string) string {
	if !strings.ContainsFunc(s, hostile) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if hostile(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// hostile tells a character that changes what a terminal shows rather
// than showing itself.
func hostile(r rune) bool {
	return r != '\t' && unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) || r == utf8.RuneError
}

// pid is a process id, or "-" for none.
func pid(pid int) string {
	if pid == 0 {
		return "-"
	}
	return fmt.Sprint(pid)
}

// truncate shortens s to n characters, the last an ellipsis, on one
// line (oneLine).
func truncate(s string, n int) string {
	s = oneLine(s)
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// oneLine writes the newlines and tabs of s as escapes (\n, \t), so that a
// cell never spans rows or columns; the writer escapes the other control
// characters.
func oneLine(s string) string { return lineBreaks.Replace(s) }

var lineBreaks = strings.NewReplacer("\n", `\n`, "\r", `\r`, "\t", `\t`)

// Command writes a command line on one line, each argument that a shell
// would split or that holds control characters quoted as Go quotes it:
// sh -c "echo a\nb".
func Command(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsFunc(a, shellSpecial) {
			a = strconv.Quote(a)
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

func shellSpecial(r rune) bool {
	return unicode.IsSpace(r) || unicode.IsControl(r) || strings.ContainsRune("\"'\\$`;&|<>()*?[]#~", r)
}

// nodeSet lists the distinct nodes of a placement in order.
func nodeSet(placement []string) string {
	var out []string
	seen := map[string]bool{}
	for _, n := range placement {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return strings.Join(out, ",")
}
