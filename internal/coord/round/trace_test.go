package round_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/coord/round"
	"github.com/cairn-hpc/cairn/internal/tracetest"
)

// TestTraces runs the scripts in testdata/*.txt. A script is a list of
// commands, one a line; the lines starting with "> " below a command are what
// it printed, and are replaced by the actual output when the test runs.
// Blank lines and lines starting with "#" are kept. The commands:
//
//	new r0@n0 r1@n1... [deadline=D] [job=NAME] [ckpt=N]   a new round; D from now
//	recover STATE        Recover the last new round's Config in STATE, then Start
//	start                Start
//	prepared rN [size=BYTES] [dump=D]
//	failed rN ["reason"]
//	lost rN ["reason"]
//	tick D               advance the clock by D, then Tick
//	wait D               advance the clock by D, step nothing
//	persisted            DecisionPersisted
//	durable rN
//	status               print the round's state and its ranks' states
//
// Every event is stepped at the current clock, which starts at t0 and only
// tick and wait move. Run with -rewrite to regenerate the expected output.
func TestTraces(t *testing.T) {
	tracetest.Run(t, "testdata/*.txt", func(t *testing.T) func(string) ([]string, error) {
		tr := &tracer{now: t0}
		return func(line string) ([]string, error) {
			tr.out = nil
			err := tr.run(line)
			return tr.out, err
		}
	})
}

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

type tracer struct {
	now time.Time
	cfg round.Config
	r   *round.Round
	out []string
}

// run executes one command. Its error is a mistake in the script; the
// round's errors are part of the output.
func (tr *tracer) run(line string) error {
	args, err := split(line)
	if err != nil {
		return err
	}
	cmd, args := args[0], args[1:]
	if cmd != "new" && cmd != "recover" && tr.r == nil {
		return fmt.Errorf("%s before new", cmd)
	}
	var ev round.Event
	switch cmd {
	case "new":
		return tr.new(args)
	case "recover":
		if len(args) != 1 {
			return fmt.Errorf("usage: recover STATE")
		}
		s, err := parseState(args[0])
		if err != nil {
			return err
		}
		tr.r, err = round.Recover(tr.cfg, s)
		if err != nil {
			tr.printf("error: %v", err)
			return nil
		}
		ev = round.Start{}
	case "status":
		st := tr.r.Stats()
		var ranks []string
		for _, rk := range st.Ranks {
			ranks = append(ranks, fmt.Sprintf("r%d=%s", rk.Rank, rk.State))
		}
		tr.printf("%s done=%t: %s", tr.r.State(), tr.r.Done(), strings.Join(ranks, " "))
		return nil
	case "start":
		ev = round.Start{}
	case "persisted":
		ev = round.DecisionPersisted{}
	case "tick", "wait":
		if len(args) != 1 {
			return fmt.Errorf("usage: %s DURATION", cmd)
		}
		d, err := time.ParseDuration(args[0])
		if err != nil {
			return err
		}
		tr.now = tr.now.Add(d)
		if cmd == "wait" {
			return nil
		}
		ev = round.Tick{}
	case "prepared", "failed", "lost", "durable":
		if len(args) == 0 {
			return fmt.Errorf("usage: %s rN ...", cmd)
		}
		n, err := parseRank(args[0])
		if err != nil {
			return err
		}
		ev, err = rankEvent(cmd, n, args[1:])
		if err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown command %q", cmd)
	}
	acts, err := tr.r.Step(tr.now, ev)
	for _, a := range acts {
		tr.printf("%s", a)
		if d, ok := a.(round.Done); ok {
			tr.printf("  %s", formatStats(d.Stats))
		}
	}
	if err != nil {
		tr.printf("error: %v", err)
	}
	return nil
}

func (tr *tracer) new(args []string) error {
	cfg := round.Config{Job: "job", Ckpt: 1, Deadline: tr.now.Add(10 * time.Second)}
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		var err error
		switch {
		case ok && k == "deadline":
			var d time.Duration
			d, err = time.ParseDuration(v)
			cfg.Deadline = tr.now.Add(d)
		case ok && k == "job":
			cfg.Job = v
		case ok && k == "ckpt":
			cfg.Ckpt, err = strconv.ParseUint(v, 10, 64)
		default:
			r, node, found := strings.Cut(a, "@")
			if !found {
				return fmt.Errorf("bad participant %q, want rN@NODE", a)
			}
			var n int
			n, err = parseRank(r)
			cfg.Participants = append(cfg.Participants, round.Participant{Rank: n, Node: node})
		}
		if err != nil {
			return err
		}
	}
	tr.cfg = cfg
	var err error
	if tr.r, err = round.New(cfg); err != nil {
		tr.printf("error: %v", err)
	}
	return nil
}

func rankEvent(cmd string, n int, args []string) (round.Event, error) {
	reason := strings.Join(args, " ")
	switch cmd {
	case "failed":
		return round.Failed{Rank: n, Reason: reason}, nil
	case "lost":
		return round.Lost{Rank: n, Reason: reason}, nil
	case "durable":
		if len(args) != 0 {
			return nil, fmt.Errorf("usage: durable rN")
		}
		return round.Durable{Rank: n}, nil
	}
	ev := round.Prepared{Rank: n}
	for _, a := range args {
		k, v, _ := strings.Cut(a, "=")
		var err error
		switch k {
		case "size":
			ev.ImageSize, err = strconv.ParseInt(v, 10, 64)
		case "dump":
			ev.Dump, err = time.ParseDuration(v)
		default:
			err = fmt.Errorf("unknown argument %q", a)
		}
		if err != nil {
			return nil, err
		}
	}
	return ev, nil
}

func (tr *tracer) printf(format string, args ...any) {
	tr.out = append(tr.out, fmt.Sprintf(format, args...))
}

func formatStats(s round.Stats) string {
	return fmt.Sprintf("stats prepare=%v persist=%v stall=%v maxdump=%v coord=%v ingest=%v bytes=%d ignored=%d recovered=%t",
		s.Prepare, s.Persist, s.Stall, s.MaxDump, s.Coord, s.Ingest, s.Bytes, s.Ignored, s.Recovered)
}

func parseRank(s string) (int, error) {
	if !strings.HasPrefix(s, "r") {
		return 0, fmt.Errorf("bad rank %q, want rN", s)
	}
	return strconv.Atoi(s[1:])
}

func parseState(s string) (round.State, error) {
	for st := round.StatePreparing; st <= round.StateAborted; st++ {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, fmt.Errorf("bad state %q", s)
}

// split cuts a command line into words; a double-quoted word may hold spaces.
func split(line string) ([]string, error) {
	var words []string
	for line = strings.TrimSpace(line); line != ""; line = strings.TrimSpace(line) {
		if line[0] == '"' {
			q, err := strconv.QuotedPrefix(line)
			if err != nil {
				return nil, fmt.Errorf("bad quoted word in %q", line)
			}
			w, _ := strconv.Unquote(q)
			words = append(words, w)
			line = line[len(q):]
			continue
		}
		w, rest, _ := strings.Cut(line, " ")
		words = append(words, w)
		line = rest
	}
	return words, nil
}
