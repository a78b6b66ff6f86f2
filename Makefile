# cairn: fault tolerance for long-running distributed jobs.
# `make help` lists the targets.

GO       ?= go
BIN      := bin/cairn
PKGS     := ./...
# The end-to-end packages: local clusters driven through the binary, one
# package a concern, each test of a package after the other.
E2E      := ./test/...
# Test binaries run at once (go test -p). An end-to-end package runs one
# local cluster at a time, so at most TESTP clusters share the machine, and
# their tests are timing-sensitive (round deadlines, holds, heartbeats): 2
# is go test's own default on a 2-core machine, pinned so that a larger one
# does not start more clusters side by side. Each package stays well under
# the 25m -timeout.
TESTP    ?= 2
# internal/coord's in-memory clusters run on 2 s node leases, which lapse
# when the package shares the machine's two cores with the container and
# end-to-end packages (etcd and the heartbeats starve): it runs alone,
# after the others.
SOLO     := github.com/cairn-hpc/cairn/internal/coord
# deploy/'s Prometheus rules and Grafana dashboard, read by Prometheus's own
# parsers: a module of its own, so that bin/cairn does not link them.
PROMCHECK := deploy/prometheus/check
GOFMTDIRS := cmd internal bench test api $(PROMCHECK)
REV      := $(shell git rev-parse --short=12 HEAD 2>/dev/null)
# The release: the newest tag (v0.9.0), or how far past it this tree is
# (v0.9.0-3-gabcdef012345, -dirty with changes). Stamped in every build.
VERSION  ?= $(shell git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null || echo v0.0.0-dev)
MOD      := github.com/cairn-hpc/cairn
LDFLAGS  := -X $(MOD)/internal/version.Version=$(VERSION) -X $(MOD)/internal/version.Revision=$(REV)
# Where `make dist` puts the release.
DIST     ?= dist
# Fuzz targets run for FUZZTIME each in `make test`; `make fuzz FUZZTIME=10m` for longer runs.
FUZZTIME ?= 5s

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: setup
setup: ## Install what cairn needs (runc, iptables, CRIU >= 4.2, Go modules); idempotent
	@./scripts/setup.sh

.PHONY: build
build: setup ## Build bin/cairn
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/cairn

.PHONY: dist
dist: setup ## Make a release in DIST (default dist/): a tarball with a static cairn, a .deb for Debian 12, SHA256SUMS
	DIST=$(abspath $(DIST)) VERSION=$(VERSION) REV=$(REV) GO=$(GO) ./scripts/dist.sh

.PHONY: demo
demo: build ## Set up, build and run the demos: one container, then a 3-node cluster job
	./$(BIN) demo
	./$(BIN) demo cluster

.PHONY: test
test: setup ## Set up and run all tests (root: real runc, CRIU, namespaces), with the race detector
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l $(GOFMTDIRS) 2>/dev/null)" || { echo "gofmt needed:"; gofmt -l $(GOFMTDIRS); exit 1; }
	cd $(PROMCHECK) && $(GO) vet ./... && $(GO) test -count=1 ./...
	$(GO) test -race -count=1 -p $(TESTP) -timeout 25m $$($(GO) list $(PKGS) | grep -vx '$(SOLO)')
	$(GO) test -race -count=1 -timeout 25m $(SOLO)
	@./scripts/fuzz.sh $(FUZZTIME)

.PHONY: e2e
e2e: setup ## Run only the end-to-end packages (test/...), TESTP at a time
	$(GO) test -race -count=1 -p $(TESTP) -timeout 25m $(E2E)

.PHONY: faults
faults: setup ## The fault matrix: every fault class after every protocol step (writes docs/reliability.md's table), and real agents killed at each failpoint
	$(GO) test -count=1 -timeout 60m -run 'TestFaultMatrix|TestCoordinatorDiesAnywhere' ./internal/coord/ -args -faults -fault-report=$(CURDIR)/docs/reliability.md
	CAIRN_FAULTS=1 $(GO) test -count=1 -timeout 60m ./test/faults/

.PHONY: chaos
chaos: setup ## ETTR under random node failures (about half an hour): the ring job's, measured, against the model's; writes docs/planning.md's table
	$(GO) test -count=1 -timeout 90m -run 'TestChaos$$' -v ./test/chaos/ -args -long -chaos-report=$(CURDIR)/docs/planning.md

.PHONY: soak
# test/mpi, with both hour-long soaks, is most of the time; the many-round
# variants of the kill tests and of the lossy network run beside it, one
# package at a time. The other end-to-end packages are make test's, alone:
# beside a 16-rank MPI soak on two cores they measured the contention, not
# cairn (TestReport's model had 82% noise and refused to call it a
# measurement).
SOAKRUN := TestProtocolsOnALossyNetwork|Kill
soak: setup ## The long matrices (about 2.5 h): every MPI scenario, the MPI soaks, many SIGKILL rounds, the lossy network's 100 seeds (CAIRN_SOAK=1)
	@CAIRN_SOAK=1 $(GO) test -count=1 -timeout 240m ./test/mpi/ & mpi=$$!; \
	trap 'kill $$mpi 2>/dev/null' INT TERM; \
	CAIRN_SOAK=1 $(GO) test -count=1 -p 1 -timeout 90m -run '$(SOAKRUN)' ./internal/store/ ./cmd/cairn/ ./internal/coord/; rest=$$?; \
	wait $$mpi; m=$$?; \
	test $$rest -eq 0 && test $$m -eq 0

.PHONY: slurm
slurm: setup ## Only the Slurm tests (also in make test): deploy/slurm/cairn.sbatch under a real Slurm, across allocations and preempted (about 3 min)
	$(GO) test -count=1 -timeout 30m -v ./test/slurm/

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME (default 5s; try FUZZTIME=10m)
	@./scripts/fuzz.sh $(FUZZTIME)

.PHONY: lint
lint: ## go vet and gofmt
	$(GO) vet $(PKGS)
	cd $(PROMCHECK) && $(GO) vet ./...
	@test -z "$$(gofmt -l $(GOFMTDIRS) 2>/dev/null)" || { gofmt -l $(GOFMTDIRS); exit 1; }

.PHONY: bench
bench: build ## Run the benchmarks (prints ratios against baselines measured in the same run; writes the targets' table of docs/benchmarks.md)
	CAIRN_BENCH_DOC=$(CURDIR)/docs/benchmarks.md $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 150m ./bench/

.PHONY: clean
clean: ## Remove build output
	rm -rf bin dist
