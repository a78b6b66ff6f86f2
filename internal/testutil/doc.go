// Package testutil holds what cairn's tests share: the root requirement,
// a Manager on a private data dir, bridge and subnet, the cairn binary
// built once per test process, and a leak check that fails a test which
// leaves a mount, cgroup, network namespace, veth or process behind, even
// when the test itself failed halfway.
//
// The end-to-end tests (test/...) share a Cluster: a local cluster made by
// `cairn up` for one test, on an underlay subnet no other test on the
// machine holds meanwhile, and what those tests ask of it: the CLI's
// records (jobs, checkpoints, events, migrations), the coordinator's and
// agents' logs, the nodes' stores, and faults (agents, the coordinator and
// nodes killed and started again).
package testutil
