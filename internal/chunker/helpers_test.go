package chunker_test

import (
	"encoding/binary"
	"math/rand/v2"
)

// randData returns n pseudo-random bytes determined by seed. ChaCha8's
// output is specified, so the bytes do not change between Go releases.
func randData(seed uint64, n int) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}
