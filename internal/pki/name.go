package pki

import (
	"errors"
	"fmt"
)

// ErrInvalidName is returned for a name that is not one lowercase DNS label.
var ErrInvalidName = errors.New("invalid name")

// MaxNameLen is the longest name allowed: the length limit of a DNS label.
const MaxNameLen = 63

// ValidateName reports whether name can name a node, the coordinator or a
// client: one DNS label of 1 to [MaxNameLen] bytes from [a-z0-9-], not
// beginning or ending with '-'. Uppercase is refused so that one machine
// cannot hold two identities differing only in case (DNS names are case
// insensitive); dots, slashes and every other byte are refused so that a
// name is never a path. The error wraps [ErrInvalidName].
func ValidateName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", ErrInvalidName)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%w: %d bytes long, at most %d allowed", ErrInvalidName, len(name), MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case c == '-':
			if i == 0 || i == len(name)-1 {
				return fmt.Errorf("%w: %q begins or ends with '-'", ErrInvalidName, name)
			}
		default:
			return fmt.Errorf("%w: %q has %q at byte %d; only a-z, 0-9 and '-' are allowed", ErrInvalidName, name, c, i)
		}
	}
	return nil
}
