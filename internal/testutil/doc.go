// Package testutil holds what cairn's tests share: the root requirement,
// a Manager on a private data dir, bridge and subnet, the cairn binary
// built once per test process, and a leak check that fails a test which
// leaves a mount, cgroup, network namespace, veth or process behind, even
// when the test itself failed halfway.
package testutil
