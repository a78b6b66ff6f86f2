#!/usr/bin/env bash
# fuzz.sh DURATION: run every Go fuzz target in the module for DURATION each.
# Each new interesting input is minimized FUZZMINIMIZE times (default 1x):
# targets that write files otherwise spend a short run shrinking their
# first input and try a few dozen inputs instead of thousands.
set -euo pipefail
dur=${1:-5s}
minimize=${FUZZMINIMIZE:-1x}
cd "$(dirname "$0")/.."
found=0
for pkg in $(go list ./...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	targets=$(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' || true)
	for t in $targets; do
		found=1
		echo "fuzz $pkg $t ($dur)"
		run() { go test -run '^$' -fuzz "^${t}\$" -fuzztime "$dur" -fuzzminimizetime "$minimize" "$pkg" >/tmp/cairn-fuzz.log 2>&1; }
		if ! run; then
			# Go's fuzzing engine sometimes fails to stop its workers in time on
			# a loaded machine ("context deadline exceeded", no failing input):
			# that is not a finding, so it gets one more go.
			if grep -q 'context deadline exceeded' /tmp/cairn-fuzz.log && ! grep -q 'Failing input' /tmp/cairn-fuzz.log; then
				echo "fuzz $pkg $t: the fuzzing engine timed out stopping; once more"
				run || { cat /tmp/cairn-fuzz.log; exit 1; }
			else
				cat /tmp/cairn-fuzz.log
				exit 1
			fi
		fi
	done
done
[ $found = 1 ] || echo "no fuzz targets"
