package tier

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
)

// MemBucket is a Bucket in memory, for tests of what runs over a tier;
// the conformance suite (tiertest) holds it to what the real ones do.
type MemBucket struct {
	mu   sync.Mutex
	objs map[string][]byte
	// Puts and PutBytes count what Put wrote.
	Puts, PutBytes int64
}

// NewMemBucket returns an empty MemBucket.
func NewMemBucket() *MemBucket { return &MemBucket{objs: map[string][]byte{}} }

func (m *MemBucket) String() string { return "mem://" }

func (m *MemBucket) Put(ctx context.Context, key string, data []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.objs[key] = append([]byte(nil), data...)
	m.Puts++
	m.PutBytes += int64(len(data))
	return nil
}

func (m *MemBucket) Get(ctx context.Context, key string) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objs[key]
	if !ok {
		return nil, fmt.Errorf("get %s: %w", key, ErrNotExist)
	}
	return append([]byte(nil), b...), nil
}

func (m *MemBucket) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	b, err := m.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	if off < 0 || n < 0 || off+n > int64(len(b)) {
		return nil, fmt.Errorf("get %s: range %d+%d outside its %d bytes: %w", key, off, n, len(b), ErrShort)
	}
	return b[off : off+n], nil
}

func (m *MemBucket) List(ctx context.Context, prefix string) ([]Object, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Object
	for k, b := range m.objs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, Object{Key: k, Size: int64(len(b))})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func (m *MemBucket) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objs, key)
	return nil
}

// Damage flips a byte of object key at off, as a failing disk would.
func (m *MemBucket) Damage(key string, off int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objs[key]
	if !ok || off >= len(b) {
		return false
	}
	b[off] ^= 0xff
	return true
}
