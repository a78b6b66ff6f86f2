package demo

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/cairn-hpc/cairn/internal/container"
	"github.com/cairn-hpc/cairn/internal/human"
	"github.com/cairn-hpc/cairn/internal/netw"
)

var (
	recvRE  = regexp.MustCompile(`(?m)^recv=(\d+)`)
	countRE = regexp.MustCompile(`(?m)^count=(\d+) t=(\d+)$`)
)

// lastRecv returns the last recv=N value in a log.
func lastRecv(log []byte) int {
	ms := recvRE.FindAllSubmatch(log, -1)
	if len(ms) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(string(ms[len(ms)-1][1]))
	return n
}

// RunContainer runs the demo of one container: a stateful program (a
// counter in memory, a file it appends to, a TCP stream between two of
// its processes) checkpointed, killed, tampered with and restored, then
// checked to be exactly as at the checkpoint and to go on; a second
// checkpoint shows deduplication. It uses a data dir and bridge of its
// own and removes them afterwards unless cfg.Keep.
func RunContainer(ctx context.Context, cfg Config) error {
	w, keep := cfg.Out, cfg.Keep
	d := &script{w: w, color: cfg.Color}
	dataDir, err := os.MkdirTemp("/var/tmp", "cairn-demo-")
	if err != nil {
		return err
	}
	bridge := netw.Bridge{Name: "cairndemo0", Subnet: netip.MustParsePrefix("10.213.250.0/24")}
	staging := filepath.Join(cfg.Staging, "demo")
	m, err := container.New(container.Options{
		DataDir: dataDir, StagingDir: staging, CRIU: cfg.CRIU,
		Runc: cfg.Runc, Bridge: bridge,
	})
	if err != nil {
		return err
	}
	const name = "counter"
	defer func() {
		if keep {
			fmt.Fprintf(w, "\nKept: cairn --data %s --bridge %s --subnet %s ps\n", dataDir, bridge.Name, bridge.Subnet)
			return
		}
		ctx := context.WithoutCancel(ctx)
		if err := m.Remove(ctx, name, true); err != nil && !errors.Is(err, container.ErrNotFound) {
			// Never remove a data dir that may still hold a mounted root.
			fmt.Fprintf(w, "\ncould not clean up (%v); the demo's data dir %s is left\n", err, dataDir)
			return
		}
		_ = bridge.Delete(ctx)
		_ = os.RemoveAll(dataDir)
		_ = os.RemoveAll(staging)
	}()

	info, err := m.CRIU(ctx)
	if err != nil {
		return err
	}
	exe := cfg.Exe
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return err
		}
	}
	d.say("Start a stateful program in a container (runc, CRIU %s)", info.Version)
	in, err := m.Run(ctx, container.Config{Name: name, Args: []string{exe, "stateapp", "-dir", "/var/lib/stateapp"}})
	if err != nil {
		return err
	}
	d.detail("container %q: pid %d, address %s, root = overlay on the host's /", in.Name, in.Pid, in.Addr)
	d.detail("it counts in memory (appending count=N to /var/lib/stateapp/count.log) and streams")
	d.detail("checksummed 4 KiB messages over TCP from one of its processes to another")
	countLog := filepath.Join(in.RootFS, "var/lib/stateapp/count.log")
	notes := filepath.Join(in.RootFS, "root/notes.txt")
	if err := waitFor(ctx, 10*time.Second, func() bool {
		b, _ := os.ReadFile(in.Log)
		return lastRecv(b) > 1000
	}); err != nil {
		return fmt.Errorf("the program did not start streaming: %w", err)
	}
	if err := os.WriteFile(notes, []byte("written before the checkpoint\n"), 0o644); err != nil {
		return err
	}
	logBefore, _ := os.ReadFile(in.Log)
	d.detail("running: %d messages received so far; /root/notes.txt written", lastRecv(logBefore))

	d.say("Checkpoint it (the program keeps running)")
	man, err := m.Checkpoint(ctx, name, container.CheckpointOptions{})
	if err != nil {
		return err
	}
	d.detail("checkpoint %s: %s; program stalled %s (CRIU dump %s), total %s",
		man.Name(), human.Bytes(man.Size()), human.Duration(man.Timing.Stall), human.Duration(man.Timing.Dump), human.Duration(man.Timing.Total))
	atCkpt, err := readCountsFromCheckpoint(ctx, m, name, man.Seq)
	if err != nil {
		return err
	}
	d.detail("at the checkpoint the counter was %d", len(atCkpt))

	time.Sleep(time.Second)
	d.say("Let it run on, then kill it and tamper with its files")
	b, _ := os.ReadFile(countLog)
	preKill := countRE.FindAllSubmatch(b, -1)
	if err := m.Kill(ctx, name, syscall.SIGKILL); err != nil {
		return err
	}
	d.detail("killed at count %d (%d counts after the checkpoint)", len(preKill), len(preKill)-len(atCkpt))
	if err := os.WriteFile(notes, []byte("overwritten after the checkpoint\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(in.RootFS, "root/after.txt"), []byte("should vanish\n"), 0o644); err != nil {
		return err
	}
	d.detail("overwrote /root/notes.txt, created /root/after.txt")

	d.say("Restore it from the checkpoint")
	restoreStart := time.Now()
	in, err = m.Restore(ctx, name, container.RestoreOptions{})
	if err != nil {
		return err
	}
	d.detail("restored in %s: pid %d, same address %s", human.Duration(time.Since(restoreStart)), in.Pid, in.Addr)
	logAtRestore, _ := os.ReadFile(in.Log)
	recvAtRestore := lastRecv(logAtRestore)
	if err := waitFor(ctx, 10*time.Second, func() bool {
		b, _ := os.ReadFile(in.Log)
		return lastRecv(b) > recvAtRestore+1000
	}); err != nil {
		return fmt.Errorf("the restored program's TCP stream did not go on: %w", err)
	}
	time.Sleep(300 * time.Millisecond)

	d.say("Check that it is exactly as at the checkpoint, and goes on")
	b, _ = os.ReadFile(countLog)
	now := countRE.FindAllSubmatch(b, -1)
	prefixOK := len(now) > len(atCkpt)
	for i := range atCkpt {
		if !prefixOK || !bytes.Equal(now[i][0], atCkpt[i]) {
			prefixOK = false
			break
		}
	}
	if err := d.check(prefixOK, "count.log holds exactly the %d lines it had at the checkpoint", len(atCkpt)); err != nil {
		return err
	}
	contiguous := true
	for i, mm := range now {
		if n, _ := strconv.Atoi(string(mm[1])); n != i+1 {
			contiguous = false
		}
	}
	rolledBack := len(preKill) > len(atCkpt) && !bytes.Equal(now[len(atCkpt)][0], preKill[len(atCkpt)][0])
	if err := d.check(contiguous && rolledBack, "the counter went on from %d (to %d now); the %d counts made after the checkpoint were rolled back",
		len(atCkpt), len(now), len(preKill)-len(atCkpt)); err != nil {
		return err
	}
	nb, _ := os.ReadFile(notes)
	if err := d.check(string(nb) == "written before the checkpoint\n", "/root/notes.txt is back to its checkpoint content"); err != nil {
		return err
	}
	_, err = os.Stat(filepath.Join(in.RootFS, "root/after.txt"))
	if err := d.check(errors.Is(err, os.ErrNotExist), "/root/after.txt, written after the checkpoint, is gone"); err != nil {
		return err
	}
	// Only what the restored program printed: when the original was killed,
	// its receiver may have seen the sender die first and said so.
	logNow, _ := os.ReadFile(in.Log)
	failed := bytes.Contains(logNow[len(logAtRestore):], []byte("FAIL"))
	if err := d.check(!failed && lastRecv(logNow) > recvAtRestore, "the TCP stream goes on: %d messages received, none lost, duplicated or corrupted",
		lastRecv(logNow)); err != nil {
		return err
	}
	d.say("Checkpoint the restored program again: only what changed is stored")
	man2, err := m.Checkpoint(ctx, name, container.CheckpointOptions{})
	if err != nil {
		return err
	}
	d.detail("checkpoint %s: %s image, %s of it new in the store (the rest is shared with %s)",
		man2.Name(), human.Bytes(man2.Size()), human.Bytes(man2.NewBytes), man.Name())
	if err := d.check(man2.NewBytes < man2.Size()/2, "deduplicated: %.0f%% of the second checkpoint was already stored",
		100*(1-float64(man2.NewBytes)/float64(man2.Size()))); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nDone: the program survived checkpoint → kill → restore.")
	return nil
}

// readCountsFromCheckpoint returns the count.log lines stored in a
// checkpoint's fs delta.
func readCountsFromCheckpoint(ctx context.Context, m *container.Manager, name string, seq int) ([][]byte, error) {
	data, err := m.Repo().ReadDeltaFile(ctx, name, seq, "var/lib/stateapp/count.log")
	if err != nil {
		return nil, err
	}
	var lines [][]byte
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if countRE.Match(sc.Bytes()) {
			lines = append(lines, append([]byte(nil), sc.Bytes()...))
		}
	}
	return lines, nil
}
