package model

import (
	"fmt"
	"math"
	"time"
)

// Bounds and defaults of an automatic interval.
const (
	// DefaultCost is the checkpoint cost assumed before a job's first
	// round is measured: about the stall of a small job's round here
	// (docs/benchmarks.md: 0.2-1 s).
	DefaultCost = time.Second
	// MinInterval is the shortest automatic interval: rounds of a job
	// never follow each other closer than this.
	MinInterval = time.Second
	// Hysteresis is how far (relative) a newly computed interval must be
	// from the current one to replace it. Near the optimum the cost
	// curve is flat: an interval 10% off costs about 0.5% of the
	// overhead more (the excess is about e²/2 of it for an error e).
	Hysteresis = 0.10
)

// Young returns Young's first-order optimum of the compute time between
// two checkpoints, sqrt(2·C·M), for a checkpoint cost c and a mean time
// between failures m.
func Young(c, m time.Duration) time.Duration {
	if c <= 0 || m <= 0 {
		return 0
	}
	return seconds(math.Sqrt(2 * c.Seconds() * m.Seconds()))
}

// Daly returns Daly's higher-order estimate of the optimal compute time
// between two checkpoints (J. T. Daly, "A higher order estimate of the
// optimum checkpoint interval for restart dumps", FGCS 22, 2006):
//
//	τ = sqrt(2CM)·[1 + (1/3)·sqrt(C/(2M)) + (1/9)·(C/(2M))] − C   if C < 2M
//	τ = M                                                         otherwise
func Daly(c, m time.Duration) time.Duration {
	if c <= 0 || m <= 0 {
		return 0
	}
	cs, ms := c.Seconds(), m.Seconds()
	if cs >= 2*ms {
		return m
	}
	x := cs / (2 * ms)
	return seconds(math.Sqrt(2*cs*ms)*(1+math.Sqrt(x)/3+x/9) - cs)
}

// Optimum returns the compute time between checkpoints that minimizes
// the expected run time under the assumptions Daly's formula
// approximates (exponential failures of mean m, a failure loses the
// work since the last checkpoint, every checkpoint costs c and may fail
// too): τ = M·(1 + W₀(−e^(−1−C/M))), W₀ the principal branch of
// Lambert's W. Expected says what is minimized.
func Optimum(c, m time.Duration) time.Duration {
	if c <= 0 || m <= 0 {
		return 0
	}
	return seconds(m.Seconds() * (1 + lambertW0(-math.Exp(-1-c.Seconds()/m.Seconds()))))
}

// lambertW0 is the principal branch of Lambert's W for x in [−1/e, 0]:
// the w ≥ −1 with w·e^w = x, by Halley's iteration.
func lambertW0(x float64) float64 {
	if x <= -1/math.E {
		return -1
	}
	// Start from the branch point's series, good near −1/e, or from x.
	w := x
	if x < -0.25 {
		p := math.Sqrt(2 * (math.E*x + 1))
		w = -1 + p - p*p/3
	}
	for range 50 {
		ew := math.Exp(w)
		f := w*ew - x
		if f == 0 {
			break
		}
		next := w - f/(ew*(w+1)-(w+2)*f/(2*w+2))
		if math.Abs(next-w) < 1e-15*math.Max(1, math.Abs(w)) {
			w = next
			break
		}
		w = next
	}
	return w
}

// Choice is an automatic checkpoint interval and what it came from.
type Choice struct {
	// Every is the interval between the starts of two rounds: the
	// compute time between checkpoints plus the checkpoint's cost.
	Every time.Duration
	Tau   time.Duration // the compute time between checkpoints (Daly's τ)
	Young time.Duration // Young's interval, sqrt(2CM) + C, for comparison
	Cost  time.Duration // C
	MTBF  time.Duration // M, the job's
	// Formula says which branch gave Tau: "daly" or "daly: C ≥ 2M,
	// τ = M"; "minimum" when Every was raised to MinInterval.
	Formula string
}

// Choose returns the interval for a job whose checkpoints cost c and
// whose mean time between failures is m: Daly's τ plus c, never shorter
// than MinInterval. A c of zero or less is DefaultCost.
func Choose(c, m time.Duration) Choice {
	if c <= 0 {
		c = DefaultCost
	}
	ch := Choice{Cost: c, MTBF: m, Tau: Daly(c, m), Formula: "daly"}
	if c >= 2*m {
		ch.Formula = "daly: C ≥ 2M, τ = M"
	}
	ch.Every = ch.Tau + c
	ch.Young = Young(c, m) + c
	if ch.Every < MinInterval {
		ch.Every, ch.Formula = MinInterval, "minimum"
	}
	return ch
}

// Changed reports whether a newly computed interval differs from the
// current one by more than Hysteresis: only then is it worth a change.
func Changed(cur, next time.Duration) bool {
	if cur <= 0 {
		return next > 0
	}
	return math.Abs(float64(next-cur)) > Hysteresis*float64(cur)
}

// String says the choice in one line, for events and reports.
func (ch Choice) String() string {
	return fmt.Sprintf("every %s: checkpoint cost C %s, job MTBF M %s, %s (τ %s; Young's sqrt(2CM)+C would be %s)",
		round(ch.Every), round(ch.Cost), round(ch.MTBF), ch.Formula, round(ch.Tau), round(ch.Young))
}

// JobMTBF is the mean time between failures of a job on nodes nodes, each
// failing independently with mean nodeMTBF: any one failure interrupts it.
func JobMTBF(nodeMTBF time.Duration, nodes int) time.Duration {
	if nodes < 1 {
		nodes = 1
	}
	return nodeMTBF / time.Duration(nodes)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// round shortens d for people: ms below 10 s, else whole seconds.
func round(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}
