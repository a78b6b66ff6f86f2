// Package control runs a cluster's control plane: the coordinator process
// of `cairn coordinator`. Package coord is the coordinator's logic over a
// catalog; this package is what it runs in: the catalog's etcd (an
// embedded single-member one in the state dir, or an external cluster),
// the event log and its hooks, the credentials and the listener.
//
// Like coord, it reaches nodes only through the agent API: nothing of the
// node stack is linked into it (internal/layering checks this).
package control
