// Package chaos tests `cairn chaos` end to end on local clusters: the ring
// job under --checkpoint-every auto with a replica, its nodes failing at
// random and coming back, its ETTR measured against the model's, its
// result exact, every node back at the end, also when the run is
// interrupted. `make chaos` runs the long version (-long): enough failures
// to hold the measured ETTR to the model's, its table written into
// docs/planning.md (-chaos-report).
package chaos
