package ringapp

import (
	"errors"
	"testing"
)

// TestBallastChurn: a ballast written every few messages, round and
// round, checks out after the messages that wrote it; a page written once
// too often or too few times, or a byte changed otherwise, is ErrCorrupt.
func TestBallastChurn(t *testing.T) {
	const messages = 3*256 + 100 // three rounds of a 1 MiB ballast's 256 pages and some
	run := func() *ballast {
		bl := newBallast(1, 7, 2, 1)
		for n := 1; n <= messages; n++ {
			bl.touch(n)
		}
		return bl
	}
	if err := run().check(messages); err != nil {
		t.Fatalf("check after %d messages: %v", messages, err)
	}
	if err := run().check(messages + 1); !errors.Is(err, ErrCorrupt) {
		t.Errorf("check against one message more = %v, want ErrCorrupt", err)
	}
	bl := run()
	bl.b[4096*5+100] ^= 1
	if err := bl.check(messages); !errors.Is(err, ErrCorrupt) {
		t.Errorf("check of a ballast with a flipped bit = %v, want ErrCorrupt", err)
	}
	// Without churn the ballast never changes.
	still := newBallast(1, 7, 2, 0)
	for n := 1; n <= messages; n++ {
		still.touch(n)
	}
	if err := still.check(messages); err != nil {
		t.Errorf("check of a ballast without churn: %v", err)
	}
}
