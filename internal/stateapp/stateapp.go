package stateapp

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

const (
	msgPayload = 4096
	msgSize    = 8 + msgPayload + 4 // seq, payload, crc32c(seq||payload)
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// fillPayload derives a message's payload from its sequence number, so the
// receiver can check the content as well as the checksum.
func fillPayload(seq uint64, p []byte) {
	r := rand.New(rand.NewPCG(seq, seq^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], r.Uint64())
	}
}

func encode(seq uint64, buf []byte) {
	binary.LittleEndian.PutUint64(buf, seq)
	fillPayload(seq, buf[8:8+msgPayload])
	binary.LittleEndian.PutUint32(buf[8+msgPayload:], crc32.Checksum(buf[:8+msgPayload], castagnoli))
}

// Main runs the program with args (without the program name) and returns
// its exit code.
func Main(args []string) int {
	fs := flag.NewFlagSet("stateapp", flag.ContinueOnError)
	dir := fs.String("dir", "/var/lib/stateapp", "directory for the count file")
	addr := fs.String("addr", "", "address the receiver listens on (default $CAIRN_IP or 127.0.0.1)")
	port := fs.Int("port", 7070, "receiver port")
	receiver := fs.Bool("receiver", false, "run as the receiving process")
	interval := fs.Duration("interval", 10*time.Millisecond, "time between counts")
	memMiB := fs.Int("mem", 0, "MiB of memory to hold and keep dirtying (random data)")
	dirtyPct := fs.Int("dirty", 10, "percent of -mem pages rewritten each -dirty-every")
	dirtyEvery := fs.Duration("dirty-every", time.Second, "how often to rewrite -dirty percent of -mem (0: only on SIGUSR1)")
	noStream := fs.Bool("no-stream", false, "do not start the TCP stream")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	host := *addr
	if host == "" {
		host = os.Getenv("CAIRN_IP")
	}
	if host == "" {
		host = "127.0.0.1"
	}
	hp := net.JoinHostPort(host, fmt.Sprint(*port))
	if *receiver {
		return receive(hp)
	}
	if *memMiB > 0 {
		go holdMemory(*memMiB, *dirtyPct, *dirtyEvery)
	}
	if !*noStream {
		self, _ := os.Executable()
		child := exec.Command(self, os.Args[1:]...)
		child.Args = append(child.Args, "-receiver")
		child.Stdout, child.Stderr = os.Stdout, os.Stderr
		if err := child.Start(); err != nil {
			fmt.Println("FAIL start receiver:", err)
			return 1
		}
		go func() {
			err := child.Wait()
			fmt.Println("FAIL receiver ended:", err)
			os.Exit(3)
		}()
		go send(hp)
	}
	return count(*dir, *interval)
}

// count appends "count=N t=UNIXNANO" lines forever.
func count(dir string, interval time.Duration) int {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	f, err := os.OpenFile(filepath.Join(dir, "count.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Println("FAIL", err)
		return 1
	}
	for n := 1; ; n++ {
		if _, err := fmt.Fprintf(f, "count=%d t=%d\n", n, time.Now().UnixNano()); err != nil {
			fmt.Println("FAIL write:", err)
			return 1
		}
		if n%50 == 0 {
			fmt.Printf("count=%d\n", n)
		}
		time.Sleep(interval)
	}
}

func send(hp string) {
	var c net.Conn
	var err error
	for i := 0; i < 500; i++ {
		if c, err = net.Dial("tcp", hp); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		fmt.Println("FAIL dial:", err)
		os.Exit(3)
	}
	w := bufio.NewWriterSize(c, 256*1024)
	buf := make([]byte, msgSize)
	for seq := uint64(1); ; seq++ {
		encode(seq, buf)
		if _, err := w.Write(buf); err != nil {
			fmt.Println("FAIL send:", err)
			os.Exit(3)
		}
		if seq%64 == 0 {
			if err := w.Flush(); err != nil {
				fmt.Println("FAIL send:", err)
				os.Exit(3)
			}
			time.Sleep(time.Millisecond) // about 250 MB/s at most: high, not all of a core
		}
	}
}

func receive(hp string) int {
	ln, err := net.Listen("tcp", hp)
	if err != nil {
		fmt.Println("FAIL listen:", err)
		return 3
	}
	c, err := ln.Accept()
	if err != nil {
		fmt.Println("FAIL accept:", err)
		return 3
	}
	ln.Close()
	r := bufio.NewReaderSize(c, 256*1024)
	buf := make([]byte, msgSize)
	want := make([]byte, msgSize)
	last := time.Now()
	var bytes int64
	for seq := uint64(1); ; seq++ {
		if _, err := io.ReadFull(r, buf); err != nil {
			if errors.Is(err, io.EOF) {
				fmt.Printf("FAIL stream closed after %d messages\n", seq-1)
			} else {
				fmt.Printf("FAIL read after %d messages: %v\n", seq-1, err)
			}
			return 3
		}
		bytes += msgSize
		got := binary.LittleEndian.Uint64(buf)
		sum := binary.LittleEndian.Uint32(buf[8+msgPayload:])
		switch {
		case crc32.Checksum(buf[:8+msgPayload], castagnoli) != sum:
			fmt.Printf("FAIL bad checksum in message %d (want seq %d)\n", got, seq)
			return 3
		case got < seq:
			fmt.Printf("FAIL duplicate message %d (want %d)\n", got, seq)
			return 3
		case got > seq:
			fmt.Printf("FAIL lost messages %d..%d\n", seq, got-1)
			return 3
		}
		encode(seq, want)
		if string(want) != string(buf) {
			fmt.Printf("FAIL payload of message %d differs\n", seq)
			return 3
		}
		if now := time.Now(); now.Sub(last) >= 100*time.Millisecond {
			fmt.Printf("recv=%d bytes=%d\n", seq, bytes)
			last = now
		}
	}
}

// holdMemory allocates mib MiB of random data and rewrites pct percent of
// its 4 KiB pages (distinct ones) every period, and whenever it gets
// SIGUSR1, printing "dirtied pages=K". On SIGUSR2 it prints
// "memsum=HEX", the SHA-256 of the buffer, so a test can compare the
// memory of a restored process with the checkpointed one.
func holdMemory(mib, pct int, period time.Duration) {
	const page = 4096
	mem := make([]byte, mib<<20)
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	fillRandom(r, mem)
	fmt.Printf("mem=%dMiB ready\n", mib)
	pages := len(mem) / page
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	var tick <-chan time.Time
	if period > 0 {
		tick = time.Tick(period)
	}
	dirty := func() {
		k := pages * pct / 100
		for _, p := range r.Perm(pages)[:k] {
			fillRandom(r, mem[p*page:(p+1)*page])
		}
		fmt.Printf("dirtied pages=%d\n", k)
	}
	for {
		select {
		case <-tick:
			dirty()
		case sig := <-sigs:
			if sig == syscall.SIGUSR1 {
				dirty()
			} else {
				fmt.Printf("memsum=%x\n", sha256.Sum256(mem))
			}
		}
	}
}

func fillRandom(r *rand.Rand, b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
}
