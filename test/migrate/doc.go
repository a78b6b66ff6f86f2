// Package migrate tests rank migrations end to end: a rank of the running
// ring moved and moved back, migrations that fail (the target agent dies,
// CRIU is killed mid-dump), and a coordinator killed in each phase of one,
// whose successor finishes or undoes it.
package migrate
