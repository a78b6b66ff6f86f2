package pki_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/cairn-hpc/cairn/internal/pki"
)

func TestValidateName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"node1", true},
		{"a", true},
		{"0", true},
		{"gpu-node-07", true},
		{strings.Repeat("a", pki.MaxNameLen), true},
		{"", false},
		{strings.Repeat("a", pki.MaxNameLen+1), false},
		{"../x", false},
		{"..", false},
		{".", false},
		{"x/y", false},
		{"/x", false},
		{`x\y`, false},
		{"node.example.com", false},
		{"Node1", false},
		{"node_1", false},
		{"-node", false},
		{"node-", false},
		{"-", false},
		{" node", false},
		{"node\x00", false},
		{"nöde", false},
		{"*", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := pki.ValidateName(tc.name)
			if tc.ok && err != nil {
				t.Errorf("ValidateName(%q) = %v, want nil", tc.name, err)
			}
			if !tc.ok && !errors.Is(err, pki.ErrInvalidName) {
				t.Errorf("ValidateName(%q) = %v, want ErrInvalidName", tc.name, err)
			}
		})
	}
}

func TestParseRole(t *testing.T) {
	tests := []struct {
		in      string
		want    pki.Role
		wantErr error
	}{
		{"agent", pki.Agent, nil},
		{"coordinator", pki.Coordinator, nil},
		{"client", pki.Client, nil},
		{"", "", pki.ErrInvalidRole},
		{"Agent", "", pki.ErrInvalidRole},
		{"admin", "", pki.ErrInvalidRole},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := pki.ParseRole(tc.in)
			if got != tc.want || !errors.Is(err, tc.wantErr) {
				t.Errorf("ParseRole(%q) = %q, %v; want %q, %v", tc.in, got, err, tc.want, tc.wantErr)
			}
		})
	}
}
