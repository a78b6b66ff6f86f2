package ringapp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"io"
)

// Errors a rank reports when the messages from its upstream are not exactly
// 0, 1, ..., messages-1, each once, intact. They come wrapped with the
// sequence numbers and ranks involved; test them with errors.Is.
var (
	// ErrCorrupt means a message failed its checksum, or its header or
	// payload is not what its sequence number and sender imply.
	ErrCorrupt = errors.New("corrupt message")
	// ErrLost means a message did not arrive: a later one came in its place
	// (lost or reordered), or the stream ended before it.
	ErrLost = errors.New("lost message")
	// ErrDuplicate means a message arrived again (every message before the
	// next expected one has already been received once), or data followed
	// the last message.
	ErrDuplicate = errors.New("duplicate message")
)

const (
	// headerSize is the size of a message header: seq u64, value u64,
	// sender u32, payload length u32, little-endian.
	headerSize = 24
	crcSize    = 4
	// maxPayload bounds -payload.
	maxPayload = 64 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// messageSize is the size on the wire of a message with payload bytes of
// payload: header, payload, CRC-32C of header and payload.
func messageSize(payload int) int { return headerSize + payload + crcSize }

// encode writes message seq carrying value from rank sender into buf, whose
// length sets the payload size.
func encode(buf []byte, seq, value uint64, sender int) {
	end := len(buf) - crcSize
	binary.LittleEndian.PutUint64(buf[0:], seq)
	binary.LittleEndian.PutUint64(buf[8:], value)
	binary.LittleEndian.PutUint32(buf[16:], uint32(sender))
	binary.LittleEndian.PutUint32(buf[20:], uint32(end-headerSize))
	fillPayload(buf[headerSize:end], seq, sender)
	binary.LittleEndian.PutUint32(buf[end:], crc32.Checksum(buf[:end], castagnoli))
}

// receiver reads the messages a rank gets from its upstream and checks each
// one: checksum, sender, payload length and content, and that it is the
// next in sequence.
type receiver struct {
	r    *bufio.Reader
	from int    // upstream rank
	next uint64 // sequence number expected next
	buf  []byte // one message
}

func newReceiver(r *bufio.Reader, from, payload int) *receiver {
	return &receiver{r: r, from: from, buf: make([]byte, messageSize(payload))}
}

// receive reads the next message and returns its value.
func (rc *receiver) receive() (uint64, error) {
	if n, err := io.ReadFull(rc.r, rc.buf); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, fmt.Errorf("%w: stream from rank %d ended before message %d (%d bytes of it)", ErrLost, rc.from, rc.next, n)
		}
		return 0, fmt.Errorf("read message %d from rank %d: %w", rc.next, rc.from, err)
	}
	b := rc.buf
	end := len(b) - crcSize
	seq := binary.LittleEndian.Uint64(b[0:])
	value := binary.LittleEndian.Uint64(b[8:])
	sender := int(binary.LittleEndian.Uint32(b[16:]))
	plen := int(binary.LittleEndian.Uint32(b[20:]))
	switch {
	case crc32.Checksum(b[:end], castagnoli) != binary.LittleEndian.Uint32(b[end:]):
		return 0, fmt.Errorf("%w: bad checksum where message %d from rank %d was due", ErrCorrupt, rc.next, rc.from)
	case plen != end-headerSize:
		return 0, fmt.Errorf("%w: message %d from rank %d has a %d-byte payload, want %d", ErrCorrupt, seq, rc.from, plen, end-headerSize)
	case sender != rc.from:
		return 0, fmt.Errorf("%w: message %d on the link from rank %d says it is from rank %d", ErrCorrupt, seq, rc.from, sender)
	case seq < rc.next:
		return 0, fmt.Errorf("%w: got message %d from rank %d again (want %d)", ErrDuplicate, seq, rc.from, rc.next)
	case seq == rc.next+1:
		return 0, fmt.Errorf("%w: message %d from rank %d missing, got %d (lost or reordered)", ErrLost, rc.next, rc.from, seq)
	case seq > rc.next:
		return 0, fmt.Errorf("%w: messages %d..%d from rank %d missing, got %d (lost or reordered)", ErrLost, rc.next, seq-1, rc.from, seq)
	}
	if off := checkPayload(b[headerSize:end], seq, sender); off >= 0 {
		return 0, fmt.Errorf("%w: payload of message %d from rank %d differs at byte %d", ErrCorrupt, seq, rc.from, off)
	}
	rc.next++
	return value, nil
}

// expectEnd checks that the stream ends after the last message.
func (rc *receiver) expectEnd() error {
	n, err := io.ReadFull(rc.r, rc.buf)
	switch {
	case n == 0 && errors.Is(err, io.EOF):
		return nil
	case err == nil:
		return fmt.Errorf("%w: message %d from rank %d after the last one (%d)", ErrDuplicate, binary.LittleEndian.Uint64(rc.buf), rc.from, rc.next-1)
	case n > 0:
		return fmt.Errorf("%w: %d stray bytes from rank %d after the last message", ErrDuplicate, n, rc.from)
	default:
		return fmt.Errorf("wait for the end of the stream from rank %d: %w", rc.from, err)
	}
}

// fillPayload fills p with the payload of message seq sent by rank sender.
func fillPayload(p []byte, seq uint64, sender int) {
	state := payloadSeed(seq, sender)
	i := 0
	for ; i+8 <= len(p); i += 8 {
		state += golden
		binary.LittleEndian.PutUint64(p[i:], mix64(state))
	}
	if i < len(p) {
		var tail [8]byte
		binary.LittleEndian.PutUint64(tail[:], mix64(state+golden))
		copy(p[i:], tail[:])
	}
}

// checkPayload returns the offset of the first byte of p that differs from
// the payload of message seq from rank sender, or -1 if none does.
func checkPayload(p []byte, seq uint64, sender int) int {
	state := payloadSeed(seq, sender)
	var w [8]byte
	for i := 0; i < len(p); i += 8 {
		state += golden
		if i+8 <= len(p) && binary.LittleEndian.Uint64(p[i:]) == mix64(state) {
			continue
		}
		binary.LittleEndian.PutUint64(w[:], mix64(state))
		for k := i; k < len(p) && k < i+8; k++ {
			if p[k] != w[k-i] {
				return k
			}
		}
	}
	return -1
}

func payloadSeed(seq uint64, sender int) uint64 {
	return mix64(seq*golden ^ uint64(sender)<<56 ^ 0x7f4a7c159e3779b9)
}

// A hello is the first thing a rank sends to its downstream, so both ends
// can check that they belong to the same run: magic, version u32, sender
// rank u32, size u32, payload u32, window u32, zero u32, messages u64, FNV-1a
// of the job name u64.
const (
	helloMagic   = "cairnrng"
	helloVersion = 1
	helloSize    = 48
)

type hello struct {
	rank, size, payload, window int
	messages                    int
	job                         uint64
}

func newHello(cfg *Config) hello {
	h := fnv.New64a()
	h.Write([]byte(cfg.Job))
	return hello{rank: cfg.Rank, size: cfg.Size, payload: cfg.Payload, window: cfg.Window, messages: cfg.Messages, job: h.Sum64()}
}

func (h hello) String() string {
	return fmt.Sprintf("rank %d of %d (messages %d, window %d, payload %d, job %016x)", h.rank, h.size, h.messages, h.window, h.payload, h.job)
}

func (h hello) marshal() []byte {
	b := make([]byte, helloSize)
	copy(b, helloMagic)
	binary.LittleEndian.PutUint32(b[8:], helloVersion)
	binary.LittleEndian.PutUint32(b[12:], uint32(h.rank))
	binary.LittleEndian.PutUint32(b[16:], uint32(h.size))
	binary.LittleEndian.PutUint32(b[20:], uint32(h.payload))
	binary.LittleEndian.PutUint32(b[24:], uint32(h.window))
	binary.LittleEndian.PutUint64(b[32:], uint64(h.messages))
	binary.LittleEndian.PutUint64(b[40:], h.job)
	return b
}

// errNotHello marks a connection that does not start with a hello.
var errNotHello = errors.New("not a ringapp hello")

func unmarshalHello(b []byte) (hello, error) {
	if len(b) != helloSize || string(b[:8]) != helloMagic {
		return hello{}, errNotHello
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != helloVersion {
		return hello{}, fmt.Errorf("hello version %d, want %d", v, helloVersion)
	}
	return hello{
		rank:     int(binary.LittleEndian.Uint32(b[12:])),
		size:     int(binary.LittleEndian.Uint32(b[16:])),
		payload:  int(binary.LittleEndian.Uint32(b[20:])),
		window:   int(binary.LittleEndian.Uint32(b[24:])),
		messages: int(binary.LittleEndian.Uint64(b[32:])),
		job:      binary.LittleEndian.Uint64(b[40:]),
	}, nil
}

// A done message goes back upstream once a rank has received every message:
// magic u64, count u64.
const (
	doneMagic = "ringdone"
	doneSize  = 16
)

func marshalDone(count int) []byte {
	b := make([]byte, doneSize)
	copy(b, doneMagic)
	binary.LittleEndian.PutUint64(b[8:], uint64(count))
	return b
}
