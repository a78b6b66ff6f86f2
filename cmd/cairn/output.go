package main

import (
	"encoding/json"
	"io"
	"os"

	"golang.org/x/term"
)

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// isTerminal reports whether f is a terminal (for colour and progress).
func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// printList writes list as JSON ([] when it is empty) or, without asJSON,
// as the table tab writes.
func printList[T any](w io.Writer, asJSON bool, list []T, tab func(io.Writer, []T) error) error {
	if !asJSON {
		return tab(w, list)
	}
	if list == nil {
		list = []T{}
	}
	return printJSON(w, list)
}
