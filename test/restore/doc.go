// Package restore tests end to end restarts that put a rank on a node
// without a copy of its image: the image fetched from its holders at
// once, or lazily while the rank already runs, with one holder dying in
// the middle.
package restore
