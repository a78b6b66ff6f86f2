package testutil

import "testing"

// TestReserveUnderlay: a subnet held by one cluster is not handed to
// another until the first test ends; then it is free again.
func TestReserveUnderlay(t *testing.T) {
	var first, second byte
	t.Run("both", func(t *testing.T) {
		first = reserveUnderlay(t, 7)
		second = reserveUnderlay(t, first)
		if second == first {
			t.Fatalf("10.218.%d.0/24 handed out twice", first)
		}
	})
	// Released when its test ended.
	if again := reserveUnderlay(t, first); again != first {
		t.Errorf("10.218.%d.0/24 still held after its test ended: got %d", first, again)
	}
}
