package v1

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// PathExec runs a command in a running container (a rank, for the CLI's
// `cairn exec JOB/RANK`): POST PathExec + NAME?arg=CMD&arg=ARG...; with
// stdin=1, the request body is the command's standard input, streamed
// (HTTP/2 carries it while the reply comes); without, it gets none. The
// reply is a stream of ExecFrames: the command's stdout and stderr as
// they come, then its exit. A failure before the command runs is an
// ordinary error reply (CodeExecNotFound, CodeExecNotExecutable,
// CodeNotFound, CodeNotRunning, ...).
//
// With tty=1&rows=R&cols=C the command runs on a terminal of its own, of
// that size: its output (stdout and stderr merged, as a terminal does)
// comes as ExecStdout frames, and the request body is a stream of
// ExecFrames too: ExecStdin for its input, ExecResize when the client's
// terminal changes size.
const PathExec = "/v1/exec/"

const (
	// CodeExecNotFound: the command is not in the container (a path from
	// its working directory, or a name on its PATH).
	CodeExecNotFound = "exec_not_found"
	// CodeExecNotExecutable: the command is in the container but not an
	// executable file.
	CodeExecNotExecutable = "exec_not_executable"
)

// Kinds of ExecFrame.
const (
	ExecStdout byte = 1
	ExecStderr byte = 2
	ExecExit   byte = 3 // Data: the exit code, 4 bytes big-endian (a signal's death is 128+N)
	ExecStdin  byte = 4 // client to agent, with tty=1: input
	ExecResize byte = 5 // client to agent, with tty=1: the terminal's size (WinSize)
)

// WinSize is a terminal's size, in characters.
type WinSize struct{ Rows, Cols uint16 }

// Encode is s as an ExecResize frame's Data: rows then columns, 2 bytes
// big-endian each.
func (s WinSize) Encode() []byte {
	return binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, s.Rows), s.Cols)
}

// DecodeWinSize reads an ExecResize frame's Data.
func DecodeWinSize(b []byte) (WinSize, error) {
	if len(b) != 4 {
		return WinSize{}, fmt.Errorf("resize frame of %d bytes, want 4", len(b))
	}
	return WinSize{binary.BigEndian.Uint16(b[:2]), binary.BigEndian.Uint16(b[2:])}, nil
}

// MaxExecFrame is the largest Data of a frame.
const MaxExecFrame = 1 << 20

// ExecFrame is one frame of PathExec's reply: a kind byte, the length of
// Data (4 bytes, big-endian), then Data.
type ExecFrame struct {
	Kind byte
	Data []byte
}

// WriteExecFrame writes one frame.
func WriteExecFrame(w io.Writer, kind byte, data []byte) error {
	if len(data) > MaxExecFrame {
		return fmt.Errorf("exec frame of %d bytes, at most %d", len(data), MaxExecFrame)
	}
	var h [5]byte
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:], uint32(len(data)))
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	_, err := w.Write(data)
	return err
}

// ReadExecFrame reads one frame; io.EOF at a frame boundary, and
// io.ErrUnexpectedEOF inside one.
func ReadExecFrame(r io.Reader) (ExecFrame, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return ExecFrame{}, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > MaxExecFrame {
		return ExecFrame{}, fmt.Errorf("exec frame of %d bytes, at most %d", n, MaxExecFrame)
	}
	f := ExecFrame{Kind: h[0], Data: make([]byte, n)}
	if _, err := io.ReadFull(r, f.Data); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return ExecFrame{}, err
	}
	return f, nil
}
