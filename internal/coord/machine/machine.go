package machine

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ErrUnexpected wraps the error Step returns for an event it ignored: a
// Result for no outstanding action, a second Start, anything after Done.
// The machine is unchanged; the driver may log it and go on.
var ErrUnexpected = errors.New("unexpected event")

// Event is an input to a machine's Step: Start or Result.
type Event interface {
	fmt.Stringer
	isEvent()
}

// Start begins a run: a new protocol takes its first step, a recovered one
// resumes from its recorded phase.
type Start struct{}

// Result reports how an action the driver performed ended.
type Result struct {
	Action Action
	// Err is nil if the action succeeded.
	Err error
	// Corrupt: the agent refused the image as damaged (RestoreRank).
	Corrupt bool
	// Damaged lists the holders that served damaged data (FetchImage).
	Damaged []string
	// Status is the rank's container status on its node (QueryRank); ""
	// when the node has no such container.
	Status string
}

func (Start) isEvent()  {}
func (Result) isEvent() {}

func (Start) String() string { return "start" }

func (r Result) String() string {
	s := "ok " + r.Action.String()
	switch {
	case r.Err != nil && r.Corrupt:
		s = "corrupt " + r.Action.String() + " " + strconv.Quote(r.Err.Error())
	case r.Err != nil:
		s = "failed " + r.Action.String() + " " + strconv.Quote(r.Err.Error())
	}
	if len(r.Damaged) > 0 {
		s += " damaged=" + strings.Join(r.Damaged, ",")
	}
	if _, ok := r.Action.(QueryRank); ok && r.Err == nil {
		s += " status=" + orNone(r.Status)
	}
	return s
}

// Action is an output of a machine's Step for the driver to perform.
type Action interface {
	fmt.Stringer
	isAction()
}

// Background reports whether the driver performs a on its own, stepping
// nothing back.
func Background(a Action) bool {
	switch a := a.(type) {
	case RepairCopy:
		return a.Background
	case FetchImage:
		return a.Background
	}
	return false
}

// The actions that call an agent. Rank and Node name the rank and the node
// whose agent is called.
type (
	// RunRank starts the rank as the job asks (its network made first).
	RunRank struct {
		Rank int
		Node string
	}
	// QueryRank asks for the rank's container; its Result carries the
	// status.
	QueryRank struct {
		Rank int
		Node string
	}
	// RemoveRank removes the rank's container and its address; Keep keeps
	// its dir (its output, as an earlier incarnation's) for a restore on
	// the same node.
	RemoveRank struct {
		Rank int
		Node string
		Keep bool
	}
	// FetchImage has Node fetch the rank's image of the ckpt from every one
	// of From at once.
	FetchImage struct {
		Rank int
		Node string
		From []string
		// Background: nothing waits for it (the copy a rank restored
		// from the stream leaves its node's store).
		Background bool
	}
	// FetchTier has Node fetch the rank's image of the ckpt from the
	// durable tier.
	FetchTier struct {
		Rank int
		Node string
	}
	// RestoreRank restores the rank from the ckpt's image, frozen and its
	// network locked; with Lazy, from those holders while it runs; with
	// Tier, from the durable tier while it runs.
	RestoreRank struct {
		Rank int
		Node string
		Lazy []string
		Tier bool
		// Stream restores from these holders eagerly, the image written
		// to staging as it arrives.
		Stream []string
	}
	// RepairCopy has Node mend its copy of the rank's image from one of
	// From; in the Background when nothing waits for it.
	RepairCopy struct {
		Rank       int
		Node       string
		From       []string
		Background bool
	}
	// ResumeRanks unlocks and thaws the ranks on Node.
	ResumeRanks struct {
		Node  string
		Ranks []int
	}
	// StallRanks locks and freezes the ranks on Node, for a hold.
	StallRanks struct {
		Node  string
		Ranks []int
	}
	// PrepareRank locks, freezes and dumps the rank into its node's
	// staging, as for a checkpoint, for a hold.
	PrepareRank struct {
		Rank int
		Node string
	}
	// AbortPrepare drops the rank's prepare and thaws it.
	AbortPrepare struct {
		Rank int
		Node string
	}
	// MoveIn has Node pull the rank's staged image from From and restore
	// it, frozen and locked, for a hold.
	MoveIn struct {
		Rank int
		Node string
		From string
	}
	// MoveOut removes the rank's stalled copy from Node, the node it left.
	MoveOut struct {
		Rank int
		Node string
	}
	// SetJobNet points Node's job network at Placement.
	SetJobNet struct {
		Node      string
		Placement []string
	}
	// DropJobNet removes the job network from Node.
	DropJobNet struct {
		Node string
	}
)

// Phase is a step of a protocol the catalog records: a coordinator that
// takes over resumes the protocol from it.
type Phase string

// Persist asks the driver to record Phase in the catalog (each machine
// says what each of its phases writes), with Reason for a phase that
// ends a run badly.
type Persist struct {
	Phase  Phase
	Reason string
}

// Failpoint asks the driver to hold at the named point if it is set (a
// test of the coordinator dying there).
type Failpoint struct {
	Name string
}

// Done ends a run: OK, or not with Reason. Err, when not OK, is the
// failures that ended it, wrapping the agents' errors (with their codes).
type Done struct {
	OK     bool
	Reason string
	Err    error
}

func (RunRank) isAction()      {}
func (QueryRank) isAction()    {}
func (RemoveRank) isAction()   {}
func (FetchImage) isAction()   {}
func (FetchTier) isAction()    {}
func (RestoreRank) isAction()  {}
func (RepairCopy) isAction()   {}
func (ResumeRanks) isAction()  {}
func (StallRanks) isAction()   {}
func (PrepareRank) isAction()  {}
func (AbortPrepare) isAction() {}
func (MoveIn) isAction()       {}
func (MoveOut) isAction()      {}
func (SetJobNet) isAction()    {}
func (DropJobNet) isAction()   {}
func (Persist) isAction()      {}
func (Failpoint) isAction()    {}
func (Done) isAction()         {}

func at(rank int, node string) string { return "r" + strconv.Itoa(rank) + "@" + node }

func ranks(rs []int) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = "r" + strconv.Itoa(r)
	}
	return strings.Join(s, ",")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func (a RunRank) String() string   { return "run " + at(a.Rank, a.Node) }
func (a QueryRank) String() string { return "query " + at(a.Rank, a.Node) }
func (a RemoveRank) String() string {
	s := "remove " + at(a.Rank, a.Node)
	if a.Keep {
		s += " keep"
	}
	return s
}
func (a FetchImage) String() string {
	s := "fetch " + at(a.Rank, a.Node) + " from=" + strings.Join(a.From, ",")
	if a.Background {
		s += " background"
	}
	return s
}
func (a FetchTier) String() string { return "fetch " + at(a.Rank, a.Node) + " from=tier" }
func (a RestoreRank) String() string {
	s := "restore " + at(a.Rank, a.Node)
	if len(a.Lazy) > 0 {
		s += " lazy=" + strings.Join(a.Lazy, ",")
	}
	if a.Tier {
		s += " lazy=tier"
	}
	if len(a.Stream) > 0 {
		s += " stream=" + strings.Join(a.Stream, ",")
	}
	return s
}
func (a RepairCopy) String() string {
	s := "repair " + at(a.Rank, a.Node) + " from=" + strings.Join(a.From, ",")
	if a.Background {
		s += " background"
	}
	return s
}
func (a ResumeRanks) String() string  { return "resume " + a.Node + " " + ranks(a.Ranks) }
func (a StallRanks) String() string   { return "stall " + a.Node + " " + ranks(a.Ranks) }
func (a PrepareRank) String() string  { return "prepare " + at(a.Rank, a.Node) }
func (a AbortPrepare) String() string { return "abort " + at(a.Rank, a.Node) }
func (a MoveIn) String() string       { return "move-in " + at(a.Rank, a.Node) + " from=" + a.From }
func (a MoveOut) String() string      { return "move-out " + at(a.Rank, a.Node) }
func (a SetJobNet) String() string {
	return "jobnet " + a.Node + " " + strings.Join(a.Placement, ",")
}
func (a DropJobNet) String() string { return "drop-jobnet " + a.Node }
func (a Persist) String() string {
	if a.Reason == "" {
		return "persist " + string(a.Phase)
	}
	return "persist " + string(a.Phase) + " " + strconv.Quote(a.Reason)
}
func (a Failpoint) String() string { return "failpoint " + a.Name }
func (a Done) String() string {
	if a.OK {
		return "done ok"
	}
	return "done failed " + strconv.Quote(a.Reason)
}

// outstanding is the set of actions a machine waits for, by their text.
// Actions print distinctly within one run (an action is never sent twice
// while the first is outstanding), so the text is their identity.
type outstanding map[string]Action

func (o outstanding) add(a Action) {
	if !Background(a) {
		o[a.String()] = a
	}
}

// take removes the action a Result answers; false if it was not
// outstanding.
func (o outstanding) take(a Action) bool {
	if a == nil {
		return false
	}
	k := a.String()
	if _, ok := o[k]; !ok {
		return false
	}
	delete(o, k)
	return true
}

// core holds what every machine has: the actions it waits for and those of
// the current Step.
type core struct {
	wait  outstanding
	out   []Action
	done  bool
	tries map[string]int // attempts of actions tried again
}

// Attempts is how many times a machine sends an idempotent call (a
// resume, a removal of a moved rank's source) before it takes its failure
// as final: a call whose reply was lost has its effect, which only a
// second call can tell.
const Attempts = 3

// again sends a again if it failed fewer than Attempts times, and says
// whether it did.
func (c *core) again(a Action) bool {
	if c.tries == nil {
		c.tries = map[string]int{}
	}
	k := a.String()
	c.tries[k]++
	if c.tries[k] >= Attempts {
		return false
	}
	c.emit(a)
	return true
}

func (c *core) emit(as ...Action) {
	for _, a := range as {
		c.wait.add(a)
		c.out = append(c.out, a)
	}
}

func (c *core) finish(ok bool, reason string) {
	c.done = true
	c.out = append(c.out, Done{OK: ok, Reason: reason})
}

// fail ends a run badly with errs.
func (c *core) fail(errs failures) {
	c.done = true
	c.out = append(c.out, Done{Reason: errs.Error(), Err: errs})
}

// begin checks an event against the run's state and returns the Result
// it is, if it is one; the caller handles Start itself.
func (c *core) begin(ev Event, started bool) (*Result, error) {
	c.out = nil
	if c.wait == nil {
		c.wait = outstanding{}
	}
	switch ev := ev.(type) {
	case nil:
		return nil, fmt.Errorf("%w: nil event", ErrUnexpected)
	case Start:
		if started {
			return nil, fmt.Errorf("%w: start: already started", ErrUnexpected)
		}
		return nil, nil
	case Result:
		if !started {
			return nil, fmt.Errorf("%w: %s before start", ErrUnexpected, ev)
		}
		if c.done {
			return nil, fmt.Errorf("%w: %s after the run ended", ErrUnexpected, ev)
		}
		if !c.wait.take(ev.Action) {
			return nil, fmt.Errorf("%w: %s answers nothing outstanding", ErrUnexpected, ev)
		}
		return &ev, nil
	}
	return nil, fmt.Errorf("%w: unknown event %T", ErrUnexpected, ev)
}

// step is every machine's Step: it checks ev against the run, starts the
// run or hands the Result on, and returns what that emitted.
func (c *core) step(ev Event, started bool, start func(), result func(Result)) ([]Action, error) {
	res, err := c.begin(ev, started)
	if err != nil {
		return nil, err
	}
	if res == nil {
		start()
	} else {
		result(*res)
	}
	out := c.out
	c.out = nil
	return out, nil
}

// idle reports whether nothing is outstanding.
func (c *core) idle() bool { return len(c.wait) == 0 }

// byNode groups ranks by their node in placement, leaving out those for
// which skip says so; nodes come out sorted by name.
func byNode(placement []string, skip func(rank int) bool) ([]string, map[string][]int) {
	m := map[string][]int{}
	for r, n := range placement {
		if n == "" || skip != nil && skip(r) {
			continue
		}
		m[n] = append(m[n], r)
	}
	nodes := make([]string, 0, len(m))
	for n := range m {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	return nodes, m
}

// nodesOf returns the distinct nodes of placement, sorted; "" left out.
func nodesOf(placement []string) []string {
	nodes, _ := byNode(placement, nil)
	return nodes
}

// failures are the errors that make a run fail, as one error that wraps
// each.
type failures []error

func (f failures) Error() string {
	s := make([]string, len(f))
	for i, err := range f {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (f failures) Unwrap() []error { return f }

// reasons joins notes into one.
func reasons(rs []string) string { return strings.Join(rs, "; ") }
