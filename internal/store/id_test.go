package store_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/store"
)

func TestID(t *testing.T) {
	// BLAKE3-256 of the empty input, from the BLAKE3 test vectors.
	const empty = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
	id := store.Hash(nil)
	if id.String() != empty {
		t.Fatalf("Hash(nil) = %s, want %s", id, empty)
	}
	if id.Short() != empty[:8] {
		t.Errorf("Short() = %s", id.Short())
	}
	parsed, err := store.ParseID(empty)
	if err != nil || parsed != id {
		t.Fatalf("ParseID = %v, %v", parsed, err)
	}
	if id.IsNull() || !(store.ID{}).IsNull() {
		t.Error("IsNull is wrong")
	}
	b, err := json.Marshal(map[string]store.ID{"id": id})
	if err != nil || string(b) != `{"id":"`+empty+`"}` {
		t.Fatalf("json.Marshal = %s, %v", b, err)
	}
	var back map[string]store.ID
	if err := json.Unmarshal(b, &back); err != nil || back["id"] != id {
		t.Fatalf("json.Unmarshal = %v, %v", back, err)
	}
}

func TestParseIDRejects(t *testing.T) {
	valid := store.Hash([]byte("x")).String()
	for _, s := range []string{
		"",
		valid[:63],
		valid + "0",
		strings.ToUpper(valid),
		"g" + valid[1:],
		" " + valid[1:],
	} {
		if _, err := store.ParseID(s); err == nil {
			t.Errorf("ParseID(%q) succeeded", s)
		}
	}
}
