package agent

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cairn-hpc/cairn/internal/proc"
)

// HealthConfig says which health probes an agent runs. A probe that goes
// bad is reported with the node's heartbeats, and the coordinator acts on
// it by each job's policy (migrate its ranks away, checkpoint, or ignore).
type HealthConfig struct {
	// Every is how often the probes run (default 5 s).
	Every time.Duration
	// DataDir is where free disk is measured; MinFreeDisk is the fraction
	// of it that must stay free (0: no disk probe).
	DataDir     string
	MinFreeDisk float64
	// MinFreeMemory is the fraction of memory that must stay available
	// (MemAvailable/MemTotal; 0: no memory probe).
	MinFreeMemory float64
	// Command is run with sh -c (CAIRN_NODE set) in a process group of
	// its own; a non-zero exit, or running longer than Timeout, is a
	// failing probe whose output says why. At its timeout, and when it
	// ends, whatever is left of its group is killed.
	Command string
	// Timeout bounds a run of Command; 0 means Every, at least 10 s.
	Timeout time.Duration
	Node    string
}

// Health runs an agent's health probes and keeps their last result.
type Health struct {
	cfg  HealthConfig
	mu   sync.Mutex
	last []string
}

// NewHealth returns the probes of cfg, not yet run.
func NewHealth(cfg HealthConfig) *Health {
	if cfg.Every <= 0 {
		cfg.Every = 5 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = max(cfg.Every, 10*time.Second)
	}
	return &Health{cfg: cfg}
}

// Warnings are the failing probes of the last run, one line each; empty
// when the node is healthy.
func (h *Health) Warnings() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.last)
}

// Run runs the probes every cfg.Every until ctx is done; changed, if not
// nil, is called with the first result and whenever the set of failing
// probes changes.
func (h *Health) Run(ctx context.Context, changed func([]string)) {
	for first := true; ; first = false {
		w := h.Check(ctx)
		h.mu.Lock()
		diff := first || !slices.Equal(w, h.last)
		h.last = w
		h.mu.Unlock()
		if diff && changed != nil {
			changed(w)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(h.cfg.Every):
		}
	}
}

// Check runs every probe once and returns the failing ones.
func (h *Health) Check(ctx context.Context) []string {
	var out []string
	if h.cfg.MinFreeDisk > 0 && h.cfg.DataDir != "" {
		var st unix.Statfs_t
		if err := unix.Statfs(h.cfg.DataDir, &st); err != nil {
			out = append(out, "disk: "+err.Error())
		} else if free := float64(st.Bavail) / float64(st.Blocks); free < h.cfg.MinFreeDisk {
			out = append(out, fmt.Sprintf("disk: %.1f%% free on %s, below %.1f%%", 100*free, h.cfg.DataDir, 100*h.cfg.MinFreeDisk))
		}
	}
	if h.cfg.MinFreeMemory > 0 {
		if avail, total, err := meminfo(); err != nil {
			out = append(out, "memory: "+err.Error())
		} else if free := float64(avail) / float64(total); free < h.cfg.MinFreeMemory {
			out = append(out, fmt.Sprintf("memory: %.1f%% available, below %.1f%%", 100*free, 100*h.cfg.MinFreeMemory))
		}
	}
	if h.cfg.Command != "" {
		cctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
		cmd := exec.CommandContext(cctx, "/bin/sh", "-c", h.cfg.Command)
		cmd.Env = append(os.Environ(), "CAIRN_NODE="+h.cfg.Node)
		b, err := proc.RunGroup(cmd)
		timedOut := cctx.Err() != nil
		cancel()
		switch {
		case err == nil, ctx.Err() != nil:
		case timedOut:
			out = append(out, fmt.Sprintf("command: timed out after %s", h.cfg.Timeout))
		default:
			msg := strings.TrimSpace(string(b))
			if len(msg) > 200 {
				msg = msg[:200] + "..."
			}
			if msg == "" {
				msg = err.Error()
			}
			out = append(out, "command: "+msg)
		}
	}
	return out
}

// meminfo reads MemAvailable and MemTotal (kB).
func meminfo() (avail, total uint64, err error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseUint(f[1], 10, 64)
		switch f[0] {
		case "MemAvailable:":
			avail = v
		case "MemTotal:":
			total = v
		}
	}
	if total == 0 {
		return 0, 0, fmt.Errorf("no MemTotal in /proc/meminfo")
	}
	return avail, total, nil
}
