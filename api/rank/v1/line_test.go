package v1

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestReadLine(t *testing.T) {
	long := strings.Repeat("x", 8000) + "\n" // longer than the reader's buffer
	r := bufio.NewReaderSize(strings.NewReader("{}\n"+long+"half"), 16)
	for _, want := range []string{"{}\n", long} {
		got, err := ReadLine(r)
		if err != nil || string(got) != want {
			t.Fatalf("ReadLine: %.20q %v, want %.20q", got, err, want)
		}
	}
	if _, err := ReadLine(r); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a message cut short: %v, want io.ErrUnexpectedEOF", err)
	}
	if _, err := ReadLine(r); !errors.Is(err, io.EOF) {
		t.Errorf("after the end: %v, want io.EOF", err)
	}
	r = bufio.NewReader(strings.NewReader(strings.Repeat("x", MaxLine) + "\n"))
	if _, err := ReadLine(r); !errors.Is(err, ErrTooLong) {
		t.Errorf("a message of MaxLine+1 bytes: %v, want ErrTooLong", err)
	}
	r = bufio.NewReader(strings.NewReader(strings.Repeat("x", MaxLine-1) + "\n"))
	if _, err := ReadLine(r); err != nil {
		t.Errorf("a message of MaxLine bytes: %v", err)
	}
}
