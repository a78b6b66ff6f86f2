package v1

import (
	"bufio"
	"errors"
	"io"
)

// ErrTooLong is ReadLine's error for a message longer than MaxLine.
var ErrTooLong = errors.New("message longer than 64 KiB")

// ReadLine reads one message, newline included, of at most MaxLine bytes
// (more than the reader's buffer if need be). A connection closed midway
// through a message is io.ErrUnexpectedEOF; one closed between messages
// is io.EOF.
func ReadLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		b, err := r.ReadSlice('\n')
		line = append(line, b...)
		if len(line) > MaxLine {
			return nil, ErrTooLong
		}
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
		case errors.Is(err, io.EOF) && len(line) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}
