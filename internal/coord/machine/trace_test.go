package machine_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cairn-hpc/cairn/internal/coord/machine"
	"github.com/cairn-hpc/cairn/internal/tracetest"
)

// TestTraces runs the scripts in testdata/*.txt. A script is a list of
// commands, one a line; the lines starting with "> " below a command are
// what it printed, and are replaced by the actual output when the test
// runs. Blank lines and lines starting with "#" are kept. The commands:
//
//	job-start NODE... [recover]        a JobStart of one rank per NODE
//	restart ckpt=N placement=A,B copies=A|B,C [leftover=A|B] [drop=C] [lazy] [tier] [recover=PHASE]
//	migrate rank=R from=A to=B placement=A,B [recover] [placed] [from-lost]
//	start                              Start
//	ok ACTION [status=S] [damaged=A,B] a Result of the outstanding ACTION (as printed)
//	failed ACTION "reason"             a failed Result
//	corrupt ACTION "reason"            a Result of an agent refusing a damaged image
//	ok-all                             ok for every outstanding action, oldest first
//
// In restart, "|" separates ranks' node lists; a rank with none ("A||B")
// has no copy. Run with -rewrite to
// regenerate the expected output.
func TestTraces(t *testing.T) {
	tracetest.Run(t, "testdata/*.txt", func(t *testing.T) func(string) ([]string, error) {
		tr := &tracer{t: t}
		return func(line string) ([]string, error) {
			tr.out = nil
			err := tr.run(line)
			return tr.out, err
		}
	})
}

type stepper interface {
	Step(time.Time, machine.Event) ([]machine.Action, error)
}

type tracer struct {
	t    *testing.T
	m    stepper
	wait []machine.Action // outstanding, oldest first
	seen []machine.Action // every action printed, for stray Results
	out  []string
}

func (tr *tracer) run(line string) error {
	cmd, rest, _ := strings.Cut(line, " ")
	switch cmd {
	case "job-start":
		f := strings.Fields(rest)
		cfg := machine.StartConfig{Job: "job"}
		for _, w := range f {
			if w == "recover" {
				cfg.Recover = true
			} else {
				cfg.Placement = append(cfg.Placement, w)
			}
		}
		m, err := machine.NewStart(cfg)
		return tr.set(m, err)
	case "restart":
		kv := options(rest)
		cfg := machine.RestartConfig{Job: "job", Placement: list(kv["placement"]), Copies: lists(kv["copies"]),
			Drop: list(kv["drop"]), Recover: machine.Phase(kv["recover"])}
		cfg.Ckpt, _ = strconv.Atoi(kv["ckpt"])
		if l, ok := kv["leftover"]; ok {
			cfg.Leftover = lists(l)
		}
		_, cfg.Lazy = kv["lazy"]
		_, cfg.Tier = kv["tier"]
		m, err := machine.NewRestart(cfg)
		return tr.set(m, err)
	case "migrate":
		kv := options(rest)
		cfg := machine.MigrationConfig{Job: "job", From: kv["from"], To: kv["to"], Placement: list(kv["placement"])}
		cfg.Rank, _ = strconv.Atoi(kv["rank"])
		_, cfg.Recover = kv["recover"]
		_, cfg.Placed = kv["placed"]
		_, cfg.FromLost = kv["from-lost"]
		m, err := machine.NewMigration(cfg)
		return tr.set(m, err)
	case "start":
		tr.step(machine.Start{})
		return nil
	case "ok-all":
		for _, a := range append([]machine.Action(nil), tr.wait...) {
			tr.step(machine.Result{Action: a})
		}
		return nil
	case "ok", "failed", "corrupt":
		a, tail, err := tr.find(rest)
		if err != nil {
			return err
		}
		res := machine.Result{Action: a}
		if cmd != "ok" {
			reason, err := strconv.Unquote(strings.TrimSpace(tail))
			if err != nil {
				return fmt.Errorf("want a quoted reason after the action: %w", err)
			}
			res.Err, res.Corrupt = errors.New(reason), cmd == "corrupt"
		} else {
			kv := options(tail)
			res.Status, res.Damaged = kv["status"], list(kv["damaged"])
		}
		tr.step(res)
		return nil
	}
	return fmt.Errorf("unknown command %q", cmd)
}

func (tr *tracer) set(m stepper, err error) error {
	if err != nil {
		tr.out = append(tr.out, "error: "+err.Error())
		return nil
	}
	tr.m, tr.wait = m, nil
	return nil
}

// find returns the outstanding action whose text begins s, longest first,
// and the rest of s; failing that, one printed before (a stray Result).
func (tr *tracer) find(s string) (machine.Action, string, error) {
	for _, set := range [][]machine.Action{tr.wait, tr.seen} {
		var best machine.Action
		for _, a := range set {
			if p := a.String(); (s == p || strings.HasPrefix(s, p+" ")) && (best == nil || len(p) > len(best.String())) {
				best = a
			}
		}
		if best != nil {
			return best, strings.TrimPrefix(s, best.String()), nil
		}
	}
	return nil, "", fmt.Errorf("no action in %q (outstanding: %v)", s, tr.wait)
}

func (tr *tracer) step(ev machine.Event) {
	if r, ok := ev.(machine.Result); ok {
		for i, a := range tr.wait {
			if a.String() == r.Action.String() {
				tr.wait = append(tr.wait[:i], tr.wait[i+1:]...)
				break
			}
		}
	}
	acts, err := tr.m.Step(time.Time{}, ev)
	if err != nil {
		tr.out = append(tr.out, "error: "+err.Error())
	}
	for _, a := range acts {
		tr.out = append(tr.out, a.String())
		tr.seen = append(tr.seen, a)
		if _, done := a.(machine.Done); !done && !machine.Background(a) {
			tr.wait = append(tr.wait, a)
		}
	}
}

// options parses "k=v k2 k3=v3" words.
func options(s string) map[string]string {
	kv := map[string]string{}
	for _, w := range strings.Fields(s) {
		k, v, _ := strings.Cut(w, "=")
		kv[k] = v
	}
	return kv
}

func list(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func lists(s string) [][]string {
	var out [][]string
	for _, part := range strings.Split(s, "|") {
		out = append(out, list(part))
	}
	return out
}
