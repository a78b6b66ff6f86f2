// Package dashboard is the coordinator's web dashboard: a page that shows
// the cluster (every node alive or dead, spare, drained, its health and
// load) and, for a job, its ranks and its timeline (checkpoints with their
// stall, size and copies, protected or not; migrations; node failures;
// restarts), kept up to date from the event stream while it is open.
//
// The page is plain HTML, CSS and a small script, embedded in the binary
// (ui/): nothing is fetched from anywhere else. It reads three JSON
// documents and one stream, all under /ui/api/:
//
//	GET /ui/api/cluster        the nodes and a summary of every job
//	GET /ui/api/jobs/JOB       a job's ranks, timeline and latest events
//	GET /ui/api/events         the events as they happen (Server-Sent Events)
//
// Everything is read through Source (the coordinator's read methods) and
// the event Exchange: the dashboard can change nothing. It answers GET and
// HEAD only, and shows neither a job's command line nor its environment.
//
// A Dashboard serves callers already authenticated (ServeHTTP: the
// coordinator mounts it under /ui/ of its API, for client certificates)
// and, through Token, browsers that log in once with a read-only token
// and then present a cookie, on a loopback address only (Serve); see
// docs/security.md, "The dashboard".
//
// Vocabulary: an entry is one item of a job's timeline; a stream is one
// browser's subscription to the events.
package dashboard
