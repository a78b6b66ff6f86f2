package lazy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// pagemapImage encodes a pagemap image as CRIU 4.2 writes it: the real
// page count in field 5, 0 in field 2.
func pagemapImage(pagesID uint32, entries ...Entry) []byte {
	b := binary.LittleEndian.AppendUint32(nil, imgCommonMagic)
	b = binary.LittleEndian.AppendUint32(b, pagemapMagic)
	msg := func(m []byte) {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(m)))
		b = append(b, m...)
	}
	msg(protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), uint64(pagesID)))
	for _, e := range entries {
		var m []byte
		m = protowire.AppendVarint(protowire.AppendTag(m, 1, protowire.VarintType), e.Vaddr)
		m = protowire.AppendVarint(protowire.AppendTag(m, 2, protowire.VarintType), 0)
		m = protowire.AppendVarint(protowire.AppendTag(m, 4, protowire.VarintType), uint64(e.Flags))
		m = protowire.AppendVarint(protowire.AppendTag(m, 5, protowire.VarintType), e.NrPages)
		msg(m)
	}
	return b
}

func TestParsePagemap(t *testing.T) {
	img := pagemapImage(3,
		Entry{Vaddr: 0x1000, NrPages: 2, Flags: FlagPresent},             // eager
		Entry{Vaddr: 0x10000, NrPages: 4, Flags: FlagPresent | FlagLazy}, // lazy
		Entry{Vaddr: 0x20000, NrPages: 1, Flags: FlagParent},             // no bytes here
		Entry{Vaddr: 0x30000, NrPages: 3, Flags: FlagPresent | FlagLazy})
	pm, err := ParsePagemap(img, 7)
	if err != nil {
		t.Fatal(err)
	}
	if pm.PagesFile() != "pages-3.img" || len(pm.Entries) != 4 {
		t.Fatalf("parsed %+v", pm)
	}
	wantOff := []int64{0, 2 * PageSize, 0, 6 * PageSize}
	for i, e := range pm.Entries {
		if e.Flags&FlagPresent != 0 && e.Off != wantOff[i] {
			t.Errorf("entry %d at offset %d, want %d", i, e.Off, wantOff[i])
		}
	}
	if e, ok := pm.Find(0x10000 + 3*PageSize); !ok || e.Vaddr != 0x10000 {
		t.Errorf("Find in the second entry: %+v %v", e, ok)
	}
	if _, ok := pm.Find(0x10000 + 4*PageSize); ok {
		t.Error("Find past the second entry found one")
	}
	eager := Eager(map[int]*Pagemap{7: pm})
	if got := eager["pages-3.img"]; len(got) != 2 || got[0] != 0 || got[1] != 1 {
		t.Errorf("eager pages %v, want [0 1]", got)
	}
}

// TestParsePagemapRefusesDamage: every truncation and a bad magic is an
// ErrBadImage, never a panic or a wrong map.
func TestParsePagemapRefusesDamage(t *testing.T) {
	img := pagemapImage(1, Entry{Vaddr: 0x1000, NrPages: 2, Flags: FlagPresent | FlagLazy})
	for n := range len(img) {
		if n == 14 { // cut after the head: a map of no pages
			continue
		}
		if _, err := ParsePagemap(img[:n], 1); err == nil && n > 0 {
			pm, _ := ParsePagemap(img[:n], 1)
			t.Errorf("truncated to %d bytes: parsed %+v", n, pm)
		} else if err != nil && !errors.Is(err, ErrBadImage) {
			t.Errorf("truncated to %d bytes: %v, want ErrBadImage", n, err)
		}
	}
	bad := bytes.Clone(img)
	bad[0] ^= 1
	if _, err := ParsePagemap(bad, 1); !errors.Is(err, ErrBadImage) {
		t.Errorf("bad magic: %v", err)
	}
	overlap := pagemapImage(1, Entry{Vaddr: 0x1000, NrPages: 4, Flags: FlagPresent}, Entry{Vaddr: 0x2000, NrPages: 1, Flags: FlagPresent})
	if _, err := ParsePagemap(overlap, 1); !errors.Is(err, ErrBadImage) {
		t.Errorf("overlapping entries: %v", err)
	}
}

func FuzzParsePagemap(f *testing.F) {
	f.Add(pagemapImage(1, Entry{Vaddr: 0x1000, NrPages: 2, Flags: FlagPresent | FlagLazy}))
	f.Fuzz(func(t *testing.T, b []byte) {
		pm, err := ParsePagemap(b, 1)
		if err != nil {
			return
		}
		var off int64
		for i, e := range pm.Entries {
			if i > 0 && pm.Entries[i-1].End() > e.Vaddr {
				t.Fatalf("entries overlap: %+v", pm.Entries)
			}
			if e.Flags&FlagPresent != 0 {
				if e.Off != off {
					t.Fatalf("entry %d at %d, want %d", i, e.Off, off)
				}
				off += int64(e.NrPages) * PageSize
			}
		}
	})
}

// memSource serves pages files from memory, slowly for the first request.
type memSource struct {
	files map[string][]byte
	slow  chan struct{}
}

func (m memSource) ReadPages(ctx context.Context, file string, p []byte, off int64) error {
	if m.slow != nil {
		select {
		case <-m.slow:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	copy(p, m.files[file][off:])
	return nil
}

// daemon plays CRIU's lazy-pages daemon: it sends requests (wide: CRIU
// 4.2's 32-byte headers) and reads replies.
type daemon struct {
	c    net.Conn
	wide bool
}

func (d daemon) get(t *testing.T, pid, vaddr, nr uint64) {
	t.Helper()
	var b []byte
	b = binary.LittleEndian.AppendUint32(b, cmdGet)
	if d.wide {
		b = binary.LittleEndian.AppendUint32(b, 0)
		b = binary.LittleEndian.AppendUint64(b, nr)
	} else {
		b = binary.LittleEndian.AppendUint32(b, uint32(nr))
	}
	b = binary.LittleEndian.AppendUint64(b, vaddr)
	b = binary.LittleEndian.AppendUint64(b, pid)
	if _, err := d.c.Write(b); err != nil {
		t.Fatal(err)
	}
}

// reply reads one reply: the pages it says, its vaddr and pid, its data.
func (d daemon) reply(t *testing.T) (nr, vaddr, pid uint64, data []byte) {
	t.Helper()
	size := 24
	if d.wide {
		size = 32
	}
	h := make([]byte, size)
	if _, err := io.ReadFull(d.c, h); err != nil {
		t.Fatal(err)
	}
	if cmd := binary.LittleEndian.Uint32(h); cmd != cmdAddF|FlagPresent<<16 {
		t.Fatalf("reply command %#x", cmd)
	}
	if d.wide {
		nr, vaddr, pid = binary.LittleEndian.Uint64(h[8:]), binary.LittleEndian.Uint64(h[16:]), binary.LittleEndian.Uint64(h[24:])
	} else {
		nr, vaddr, pid = uint64(binary.LittleEndian.Uint32(h[4:])), binary.LittleEndian.Uint64(h[8:]), binary.LittleEndian.Uint64(h[16:])
	}
	data = make([]byte, nr*PageSize)
	if _, err := io.ReadFull(d.c, data); err != nil {
		t.Fatal(err)
	}
	return nr, vaddr, pid, data
}

func (d daemon) close(t *testing.T) {
	t.Helper()
	b := make([]byte, 24)
	if d.wide {
		b = make([]byte, 32)
	}
	binary.LittleEndian.PutUint32(b, cmdClose)
	if _, err := d.c.Write(b); err != nil {
		t.Fatal(err)
	}
	status := make([]byte, 4)
	if _, err := io.ReadFull(d.c, status); err != nil || binary.LittleEndian.Uint32(status) != 0 {
		t.Fatalf("close status %v %v", status, err)
	}
	d.c.Close()
}

// TestServer: replies come in request order even when a later one is
// ready first, carry the asked vaddr and pid, stop at the end of the
// pagemap entry, and hold the pages file's bytes at the entry's offset;
// CLOSE ends the session well. Both header widths.
func TestServer(t *testing.T) {
	for _, wide := range []bool{true, false} {
		pages := make([]byte, 10*PageSize)
		for i := range pages {
			pages[i] = byte(i / PageSize)
		}
		pm, err := ParsePagemap(pagemapImage(1,
			Entry{Vaddr: 0x1000, NrPages: 2, Flags: FlagPresent},
			Entry{Vaddr: 0x100000, NrPages: 8, Flags: FlagPresent | FlagLazy}), 5)
		if err != nil {
			t.Fatal(err)
		}
		slow := make(chan struct{})
		src := memSource{files: map[string][]byte{"pages-1.img": pages}, slow: slow}
		srv, err := Listen(map[int]*Pagemap{5: pm}, src, nil)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", itoa(srv.Port())))
		if err != nil {
			t.Fatal(err)
		}
		d := daemon{c, wide}
		d.get(t, 5, 0x100000+6*PageSize, 4) // 2 pages left in the entry
		d.get(t, 5, 0x100000, 1)
		close(slow)
		nr, vaddr, pid, data := d.reply(t)
		if nr != 2 || vaddr != 0x100000+6*PageSize || pid != 5 || data[0] != 8 || data[PageSize] != 9 {
			t.Fatalf("first reply: %d pages at %#x of %d, first bytes %d %d", nr, vaddr, pid, data[0], data[PageSize])
		}
		nr, vaddr, _, data = d.reply(t)
		if nr != 1 || vaddr != 0x100000 || data[0] != 2 {
			t.Fatalf("second reply: %d pages at %#x, first byte %d", nr, vaddr, data[0])
		}
		d.close(t)
		if err := srv.Err(); err != nil {
			t.Fatalf("session: %v", err)
		}
		if p, r, _ := srv.Stats(); p != 3 || r != 2 {
			t.Fatalf("stats: %d pages, %d requests", p, r)
		}
	}
}

// TestServerRefusesStrangers: a request for a process or pages the image
// does not have ends the session with an error: CRIU's daemon then fails,
// and its container with it, rather than get wrong pages.
func TestServerRefusesStrangers(t *testing.T) {
	pm, _ := ParsePagemap(pagemapImage(1, Entry{Vaddr: 0x1000, NrPages: 1, Flags: FlagPresent}), 5)
	for _, req := range [][3]uint64{{6, 0x1000, 1}, {5, 0x1000, 1}, {5, 0x9000, 1}} {
		srv, err := Listen(map[int]*Pagemap{5: pm}, memSource{files: map[string][]byte{"pages-1.img": make([]byte, PageSize)}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", itoa(srv.Port())))
		if err != nil {
			t.Fatal(err)
		}
		daemon{c, true}.get(t, req[0], req[1], req[2])
		select {
		case <-srv.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("session did not end")
		}
		if srv.Err() == nil {
			t.Errorf("request %v: session ended well", req)
		}
		c.Close()
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestServerRefusesOtherUsers: a local user who connects to the page
// server's loopback port before the daemon does is hung up on; the
// daemon's connection (this test's, as root) is the one served.
func TestServerRefusesOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root, to connect as another user")
	}
	pm, _ := ParsePagemap(pagemapImage(1, Entry{Vaddr: 0x1000, NrPages: 1, Flags: FlagPresent | FlagLazy}), 5)
	srv, err := Listen(map[int]*Pagemap{5: pm}, memSource{files: map[string][]byte{"pages-1.img": make([]byte, PageSize)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	// nobody connects and holds on, reading what it is sent.
	stranger := exec.Command("bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/"+itoa(srv.Port())+"; cat <&3 >/dev/null; echo hung-up")
	stranger.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out := make(chan string, 1)
	go func() {
		b, _ := stranger.CombinedOutput()
		out <- string(b)
	}()
	select {
	case got := <-out:
		if !strings.Contains(got, "hung-up") {
			t.Fatalf("the stranger's connection: %q", got)
		}
	case <-time.After(10 * time.Second):
		_ = stranger.Process.Kill()
		t.Fatal("the page server kept a connection of another user")
	}
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", itoa(srv.Port())))
	if err != nil {
		t.Fatal(err)
	}
	d := daemon{c, true}
	d.get(t, 5, 0x1000, 1)
	if nr, _, _, _ := d.reply(t); nr != 1 {
		t.Fatalf("reply of %d pages", nr)
	}
	d.close(t)
	if err := srv.Err(); err != nil {
		t.Fatalf("session: %v", err)
	}
}
