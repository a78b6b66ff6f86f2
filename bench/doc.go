// Package bench holds cairn's benchmarks. Each prints its figures next to
// a baseline measured in the same run (these machines are small and
// shared, so only ratios within one run mean much). Run them with
// `make bench`; docs/benchmarks.md records the latest figures.
package bench
