// Package check holds the test that reads deploy/'s Prometheus rules and
// Grafana dashboard with Prometheus's own rule-file and PromQL parsers,
// as `promtool check rules` does. It is a module of its own so that
// cairn's binary does not link the Prometheus server's packages; cairn's
// `make test` runs it. The test that every metric these queries name
// exists is in internal/metrics (TestDeployNamesMetrics).
package check
