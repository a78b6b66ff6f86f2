package coord

// The coordinator's parts, one concern each. Each reaches what the
// parts share (the catalog, the agents, the job locks, the log, the
// events) through the coordinator it belongs to.
type (
	records      struct{ c *Coordinator }
	nodeReports  struct{ c *Coordinator }
	replicator   struct{ c *Coordinator }
	rounds       struct{ c *Coordinator }
	migrations   struct{ c *Coordinator }
	jobRuns      struct{ c *Coordinator }
	intervals    struct{ c *Coordinator }
	fence        struct{ c *Coordinator }
	lifecycle    struct{ c *Coordinator }
	rankAPI      struct{ c *Coordinator }
	metricsFeed  struct{ c *Coordinator }
	failureTally struct{ c *Coordinator }
)
