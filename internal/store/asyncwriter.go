package store

import (
	"io"
	"sync"
)

// asyncWriter collects writes into 1 MiB buffers and writes them to w on
// a goroutine of its own, so that the caller (Put, holding the store's
// lock) copies bytes and goes on while the disk catches up. Flush waits
// until everything written so far has reached w. It is not safe for
// concurrent use; the store's lock serialises it.
type asyncWriter struct {
	w   io.Writer
	buf []byte
	ch  chan []byte
	wg  sync.WaitGroup // buffers sent but not yet written

	closeOnce sync.Once

	mu  sync.Mutex
	err error // the first error of w, returned by every later call
}

const asyncBufSize = 1 << 20

func newAsyncWriter(w io.Writer) *asyncWriter {
	a := &asyncWriter{w: w, buf: make([]byte, 0, asyncBufSize+64<<10), ch: make(chan []byte, 4)}
	go a.loop()
	return a
}

func (a *asyncWriter) loop() {
	for b := range a.ch {
		if a.error() == nil {
			if _, err := a.w.Write(b); err != nil {
				a.mu.Lock()
				a.err = err
				a.mu.Unlock()
			}
		}
		a.wg.Done()
	}
}

func (a *asyncWriter) error() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

func (a *asyncWriter) Write(p []byte) (int, error) {
	if err := a.error(); err != nil {
		return 0, err
	}
	a.buf = append(a.buf, p...)
	if len(a.buf) >= asyncBufSize {
		a.send()
	}
	return len(p), nil
}

func (a *asyncWriter) send() {
	a.wg.Add(1)
	a.ch <- a.buf
	a.buf = make([]byte, 0, asyncBufSize+64<<10)
}

// Flush writes out what is buffered and waits until w has everything.
func (a *asyncWriter) Flush() error {
	if len(a.buf) > 0 && a.error() == nil {
		a.send()
	}
	a.wg.Wait()
	return a.error()
}

// Close flushes and stops the goroutine. Later calls return the first
// error, if any.
func (a *asyncWriter) Close() error {
	err := a.Flush()
	a.closeOnce.Do(func() { close(a.ch) })
	return err
}
