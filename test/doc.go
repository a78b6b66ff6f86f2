// Package test holds cairn's end-to-end scenarios: a local cluster made by
// `cairn up` (a coordinator and agents in network namespaces), real runc
// and CRIU, driven through the cairn binary as a user would. The tests need
// root; each one builds its own cluster with names, subnets and dirs of its
// own and checks that nothing of it is left afterwards.
package test
