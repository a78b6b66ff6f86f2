package v1

import "time"

// SuffixReport follows PathJob + NAME: GET the job's Report.
const SuffixReport = "/report"

// Report is the overhead model of a job so far (docs/planning.md, "The
// overhead of a job"): the measured terms of
//
//	t_total = t_comp + α·t_comm + n·(t_coord + t_write + t_cont) + t_after
//
// per checkpoint and for the job, held against its measured run time;
// its replication; its checkpoint interval; and how likely it can restart
// after simultaneous node failures. Times of the model are in seconds.
type Report struct {
	Job      string    `json:"job"`
	State    JobState  `json:"state"`
	At       time.Time `json:"at"`    // when the report was made
	Ranks    int       `json:"ranks"` // of the job
	Nodes    int       `json:"nodes"` // the job's ranks run on that many nodes
	Replicas int       `json:"replicas"`
	// Ckpts are the job's checkpoint rounds that froze its ranks, oldest
	// first.
	Ckpts       []CkptTerms `json:"ckpts"`
	Model       Overhead    `json:"model"`
	Replication Replication `json:"replication"`
	// Every is the interval of the job's periodic checkpoints in force
	// (0: none); Interval says how it was chosen if it is automatic.
	Every    time.Duration `json:"every_ns,omitempty"`
	Interval *Interval     `json:"interval,omitempty"`
	MTBF     MTBF          `json:"mtbf"`
	// Restart is the probability that the job can restart after 1, 2
	// and 3 simultaneous random node failures.
	Restart []RestartOdds `json:"restart"`
}

// CkptTerms are one round's terms, in seconds.
type CkptTerms struct {
	Seq   int       `json:"seq"`
	State CkptState `json:"state"`
	Start time.Time `json:"start"`
	// Stall = TCoord + TWrite + TCont: the ranks frozen.
	Stall  float64 `json:"stall"`
	TCoord float64 `json:"t_coord"`
	TWrite float64 `json:"t_write"`
	TCont  float64 `json:"t_cont"`
	// TAfter is the job's loss after the thaw (its images being stored,
	// its connections recovering from the network lock), and TCopy its
	// loss while they are copied to other nodes; both measured from its
	// progress (0 if it reports none).
	TAfter float64 `json:"t_after"`
	TCopy  float64 `json:"t_copy"`
	// Cost is what the checkpoint cost the job: Stall + TAfter + TCopy.
	Cost   float64 `json:"cost"`
	Ingest float64 `json:"ingest"` // the thaw until every image is stored
	Bytes  int64   `json:"bytes"`
	// CopyBytes were fetched by the nodes that copied its images, over
	// CopyTime.
	CopyBytes int64   `json:"copy_bytes"`
	CopyTime  float64 `json:"copy_time"`
}

// Overhead holds the model's terms for the job's run from From to To, in
// seconds, against the run's measured length (Run). TCoord, TWrite and
// TCont are means per checkpoint (the model's n·(...)); the others are
// sums.
type Overhead struct {
	From   time.Time `json:"from"`
	To     time.Time `json:"to"`
	Run    float64   `json:"run"`
	TComp  float64   `json:"t_comp"`
	TComm  float64   `json:"t_comm"`
	Alpha  float64   `json:"alpha"`
	N      int       `json:"n"`
	TCoord float64   `json:"t_coord"`
	TWrite float64   `json:"t_write"`
	TCont  float64   `json:"t_cont"`
	TAfter float64   `json:"t_after"`
	// TOther are the ranks' other stalls: migrations.
	TOther float64 `json:"t_other"`
	Total  float64 `json:"t_total"` // the sum of the terms
	// Residual is Run − Total; Checked says whether it is a measurement
	// (the job reports its progress) or zero by construction (t_comp
	// is then the run minus the stalls), and Within whether |Residual|
	// is at most Tolerance, the noise of the measurement.
	Residual  float64 `json:"residual"`
	Tolerance float64 `json:"tolerance"`
	Checked   bool    `json:"checked"`
	Within    bool    `json:"within"`
	// OverheadPct is what checkpoints and replication add to the job's
	// work, t_total/(t_comp + t_comm) − 1, in percent.
	OverheadPct float64   `json:"overhead_pct"`
	AlphaBasis  string    `json:"alpha_basis"`
	Progress    *Progress `json:"progress,omitempty"`
	Notes       []string  `json:"notes,omitempty"`
}

// Progress is what the model took from the job's progress reports (rank
// events of kind progress).
type Progress struct {
	Rank    int     `json:"rank"`    // whose reports
	Samples int     `json:"samples"` // reports used
	Units   float64 `json:"units"`   // work done over the span
	// Rate is the job's undisturbed rate (units/s): over the intervals
	// between reports that no round, store or copy touched; Noise the
	// relative spread of those intervals' rates.
	Rate  float64 `json:"rate"`
	Noise float64 `json:"noise"`
	// RateAfter and RateCopy are its rates after a thaw (while images are
	// stored and connections recover) and while they are copied (the
	// same when the two could not be told apart; 0: no such time).
	RateAfter float64 `json:"rate_after"`
	RateCopy  float64 `json:"rate_copy"`
	// AlphaErr is α's standard error.
	AlphaErr float64 `json:"alpha_err"`
}

// Replication is what was copied for the job's checkpoints.
type Replication struct {
	Copies int     `json:"copies"`
	Bytes  int64   `json:"bytes"`
	Time   float64 `json:"time"` // seconds during which copies were made
}

// Interval is an automatic checkpoint interval and what it came from
// (docs/planning.md, "The checkpoint interval").
type Interval struct {
	// Every is the time between the starts of two rounds: Tau (Daly's
	// optimal compute time between checkpoints) plus Cost.
	Every time.Duration `json:"every_ns"`
	Tau   time.Duration `json:"tau_ns"`
	// Young is Young's interval for the same figures, for comparison.
	Young time.Duration `json:"young_ns"`
	// Cost is C, a checkpoint's cost to the job, and MTBF is M, the
	// job's mean time between failures; the bases say where they come
	// from.
	Cost      time.Duration `json:"cost_ns"`
	CostBasis string        `json:"cost_basis"`
	MTBF      time.Duration `json:"mtbf_ns"`
	MTBFBasis string        `json:"mtbf_basis"`
	Formula   string        `json:"formula"`
	At        time.Time     `json:"at"`
}

// MTBF is the mean time between failures the coordinator knows for a
// job's nodes.
type MTBF struct {
	// Node is a node's MTBF in use (0: none known), from Source: "job"
	// (its --mtbf), "estimate" (the cluster's node failures, once
	// Trusted) or "coordinator" (its --mtbf). Job is the job's: Node
	// over the job's nodes.
	Node   time.Duration `json:"node_ns,omitempty"`
	Job    time.Duration `json:"job_ns,omitempty"`
	Source string        `json:"source,omitempty"`
	// Estimate is the node-time observed (Exposure, since Since) over
	// the node failures seen (Failures); Trusted once there are enough.
	Estimate time.Duration `json:"estimate_ns,omitempty"`
	Failures int           `json:"failures"`
	Exposure time.Duration `json:"exposure_ns"`
	Since    time.Time     `json:"since,omitempty"`
	Trusted  bool          `json:"trusted"`
}

// RestartOdds is how likely the job can restart after Failures
// simultaneous random node failures among the cluster's live nodes.
type RestartOdds struct {
	Failures int `json:"failures"`
	// Copies is the probability over where the copies of the job's
	// newest restorable checkpoint are (nil: not computed), Plan cairn
	// plan's for the job's nodes and replicas (ring placement).
	Copies *float64 `json:"copies,omitempty"`
	Plan   *float64 `json:"plan,omitempty"`
}
