# Everything a developer or CI runs goes through here. `make help` lists it.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO          ?= go
BIN         := $(CURDIR)/bin
TOOLS       := $(BIN)/tools
# Which Debian's Slurm the sandbox runs: bookworm (22.05, this machine's
# own), trixie (24.11) or sid (26.05); see sandbox/root.sh. Each has its
# own state dir and ports by default, so they can be up side by side.
SANDBOX_SLURM ?= bookworm
SANDBOX_DIR ?= $(if $(filter bookworm,$(SANDBOX_SLURM)),/tmp/pvsb,/tmp/pvsb-$(SANDBOX_SLURM))
export SANDBOX_DIR SANDBOX_SLURM
# Binaries say which commit they were built from (--version). The Go
# toolchain stamps that only where git can read the checkout, and a
# machine's GOFLAGS may turn it off; ask for it explicitly when it works.
BUILDVCS    ?= $(shell git rev-parse --is-inside-work-tree >/dev/null 2>&1 && echo true || echo false)

# Code generators and linters are pinned here and installed into bin/tools,
# so `make proto` gives the same bytes on every machine. protoc itself comes
# from Debian's protobuf-compiler (3.21.12 on Debian 12), because it cannot
# be installed with `go install`.
PROTOC_GEN_GO      := google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC := google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
STATICCHECK        := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: help
help: ## list the targets and the variables they use, with their values now
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | \
	awk -F':.*## ' -v sb='$(SANDBOX_DIR)' -v ft='$(FUZZTIME)' \
		'{d=$$2; gsub(/\$$\(SANDBOX_DIR\)/, sb, d); gsub(/\$$\(FUZZTIME\)/, ft, d); printf "  %-19s %s\n", $$1, d}'
	@printf '\nvariables (set as make VAR=value):\n'
	@printf '  %-19s %s\n' 'GO' '$(GO) ($(shell $(GO) env GOVERSION 2>/dev/null || echo "not found"))' \
		'SANDBOX_SLURM' '$(SANDBOX_SLURM)' 'SANDBOX_DIR' '$(SANDBOX_DIR)' 'FUZZTIME' '$(FUZZTIME)' 'BUILDVCS' '$(BUILDVCS)'
	@printf '  the sandbox'"'"'s own (SANDBOX_SSH_PORT and others) are listed in docs/development.md, "The sandbox"\n'

# The worker is built static (CGO_ENABLED=0): the plugin ships it to
# the login node beside it (slurm/ship.go), and a compute node's libc is
# not this machine's. For nodes of another kind, build
# bin/fluksio-worker-<GOOS>-<GOARCH> the same way with GOOS and GOARCH.
.PHONY: build
build: ## build bin/provisioner-slurm, bin/host-example, bin/fluksio-worker, bin/testplugin and bin/provisioner-conformance
	@echo "==> building"
	$(GO) build -buildvcs=$(BUILDVCS) -o $(BIN)/provisioner-slurm ./plugin
	$(GO) build -buildvcs=$(BUILDVCS) -o $(BIN)/host-example ./host-example
	CGO_ENABLED=0 $(GO) build -buildvcs=$(BUILDVCS) -o $(BIN)/fluksio-worker ./worker/fluksio-worker
	$(GO) build -buildvcs=$(BUILDVCS) -o $(BIN)/testplugin ./examples/testplugin
	$(GO) build -buildvcs=$(BUILDVCS) -o $(BIN)/provisioner-conformance ./shared/conformance/provisioner-conformance

$(TOOLS)/protoc-gen-go:
	GOBIN=$(TOOLS) $(GO) install $(PROTOC_GEN_GO)
$(TOOLS)/protoc-gen-go-grpc:
	GOBIN=$(TOOLS) $(GO) install $(PROTOC_GEN_GO_GRPC)
$(TOOLS)/staticcheck:
	GOBIN=$(TOOLS) $(GO) install $(STATICCHECK)

.PHONY: proto
proto: $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc ## regenerate internal/pb from shared/proto
	@command -v protoc >/dev/null || { echo "protoc is missing: apt-get install protobuf-compiler"; exit 1; }
	PATH=$(TOOLS):$$PATH protoc -I shared/proto \
		--go_out=internal/pb --go_opt=paths=source_relative \
		--go-grpc_out=internal/pb --go-grpc_opt=paths=source_relative \
		shared/proto/provisioner.proto

.PHONY: check-proto
check-proto: ## fail if the generated code is not what `make proto` makes
	@tmp=$$(mktemp -d) && cp -r internal/pb $$tmp/ && \
	$(MAKE) -s proto && \
	if ! diff -r $$tmp/pb internal/pb >/dev/null; then \
		diff -r $$tmp/pb internal/pb | head -20; cp -r $$tmp/pb/. internal/pb/; rm -rf $$tmp; \
		echo "internal/pb is stale: run make proto and commit it"; exit 1; fi; \
	rm -rf $$tmp; echo "==> generated code is current"

# The Python reference plugin's stubs: Debian's protoc and the gRPC plugin
# of protobuf-compiler-grpc, the same gRPC release (1.51) as the
# python3-grpcio it runs on. (python3-grpc-tools is gRPC 1.14, whose
# bundled protoc writes code in a style protobuf 4 keeps only for old
# code.) Generated code is committed, so the plugin runs from a checkout;
# check-python-proto keeps it current.
PY_LOCAL := examples/python-local
.PHONY: python-proto
python-proto: ## regenerate examples/python-local/gen from shared/proto and its own protos
	@command -v protoc >/dev/null && command -v grpc_python_plugin >/dev/null || { echo "protoc or grpc_python_plugin is missing: apt-get install protobuf-compiler protobuf-compiler-grpc"; exit 1; }
	protoc -I shared/proto -I $(PY_LOCAL)/proto \
		--python_out=$(PY_LOCAL)/gen --grpc_python_out=$(PY_LOCAL)/gen --plugin=protoc-gen-grpc_python=$$(command -v grpc_python_plugin) \
		shared/proto/provisioner.proto $(PY_LOCAL)/proto/health.proto $(PY_LOCAL)/proto/controller.proto $(PY_LOCAL)/proto/rpc_status.proto

.PHONY: check-python-proto
check-python-proto: ## fail if examples/python-local/gen is not what `make python-proto` makes
	@tmp=$$(mktemp -d) && cp -r $(PY_LOCAL)/gen $$tmp/ && \
	$(MAKE) -s python-proto && \
	if ! diff -r -x __pycache__ $$tmp/gen $(PY_LOCAL)/gen >/dev/null; then \
		diff -r -x __pycache__ $$tmp/gen $(PY_LOCAL)/gen | head -20; cp -r $$tmp/gen/. $(PY_LOCAL)/gen/; rm -rf $$tmp; \
		echo "$(PY_LOCAL)/gen is stale: run make python-proto and commit it"; exit 1; fi; \
	rm -rf $$tmp; echo "==> the Python stubs are current"

.PHONY: check-shared
check-shared: ## fail if shared/ imports slurm/, plugin/ or host-example/, or the contract and the plugin SDK import engine/
	@bad=$$($(GO) list -deps ./shared/... | grep -E '^github.com/fluksio/provision/(slurm|plugin|host-example)' || true); \
	if [ -n "$$bad" ]; then echo "shared/ must not import: $$bad"; exit 1; fi; \
	bad=$$($(GO) list -deps ./shared ./shared/plugin ./shared/sharedtest | grep -E '^github.com/fluksio/provision/(engine|worker)(/|$$)' || true); \
	if [ -n "$$bad" ]; then echo "the contract and the plugin SDK must not import the engine side: $$bad"; exit 1; fi; \
	echo "==> shared/ stands alone"

.PHONY: check-plugin-deps
check-plugin-deps: ## fail if the plugin binary or the contract package links an HCL parser, the host or the engine kit, or slurm/internal/queue the provisioner
	@bad=$$($(GO) list -deps ./plugin ./shared ./examples/testplugin | grep -E '^github.com/(hashicorp/hcl/|zclconf/go-cty)|^github.com/fluksio/provision/(host-example|engine)(/|$$)' || true); \
	if [ -n "$$bad" ]; then echo "a plugin must not link these (they belong to the host):"; echo "$$bad" | sed 's/^/  /'; exit 1; fi; \
	bad=$$($(GO) list -deps ./worker/fluksio-worker | grep -E '^(google.golang.org/(grpc|protobuf)|github.com/hashicorp/(go-plugin|hcl/))|^github.com/fluksio/provision/(engine|shared/plugin|internal/(wire|pb))(/|$$)' || true); \
	if [ -n "$$bad" ]; then echo "the worker runs on compute nodes and must not link the engine, the host, the plugin SDK or the wire:"; echo "$$bad" | sed 's/^/  /'; exit 1; fi; \
	bad=$$($(GO) list -deps ./shared | grep -E '^(google.golang.org/(grpc|protobuf)|github.com/hashicorp/(go-plugin|hcl/))' || true); \
	if [ -n "$$bad" ]; then echo "the contract package (shared) must not import the wire or HCL:"; echo "$$bad" | sed 's/^/  /'; exit 1; fi; \
	bad=$$($(GO) list -deps ./plugin ./host-example ./slurm ./shared ./shared/plugin ./shared/conformance ./engine/... ./worker/... | grep -E '^github.com/fluksio/provision/shared/sharedtest$$' || true); \
	if [ -n "$$bad" ]; then echo "shared/sharedtest is for tests only; non-test code imports it"; exit 1; fi; \
	deps=$$($(GO) list -deps ./slurm/internal/queue 2>&1) || { echo "$$deps" | head -5; echo "slurm/internal/queue does not list: an import of package slurm (which imports it) is a cycle; the queue must not import the provisioner"; exit 1; }; \
	bad=$$(echo "$$deps" | grep -E '^github.com/fluksio/provision/(slurm|plugin|engine|host-example)(/|$$)' | grep -vE '^github.com/fluksio/provision/slurm/(internal/queue|sshrun|rpcbudget|sbatch)$$' || true); \
	if [ -n "$$bad" ]; then echo "slurm/internal/queue runs the commands and must not import the provisioner (package slurm), the plugin or the engine: its lock stays out of reach:"; echo "$$bad" | sed 's/^/  /'; exit 1; fi; \
	echo "==> the plugin links no HCL and nothing of the host or the engine kit; the worker nothing of the engine; the contract imports no grpc or hcl; the queue nothing of the provisioner"

.PHONY: check-tidy
check-tidy: ## fail if go mod tidy would change go.mod or go.sum
	@tmp=$$(mktemp -d) && cp go.mod go.sum $$tmp/ && $(GO) mod tidy && \
	if ! cmp -s go.mod $$tmp/go.mod || ! cmp -s go.sum $$tmp/go.sum; then \
		diff -u $$tmp/go.mod go.mod | head -30; cp $$tmp/go.mod $$tmp/go.sum .; rm -rf $$tmp; \
		echo "go.mod or go.sum is not tidy: run go mod tidy and commit it"; exit 1; fi; \
	rm -rf $$tmp; echo "==> go.mod is tidy"

.PHONY: lint
lint: $(TOOLS)/staticcheck check-shared check-plugin-deps check-proto check-python-proto check-tidy ## gofmt, go vet, staticcheck, comments' file names, the docs' tests and files, a build for macOS and FreeBSD, and the checks above
	@echo "==> gofmt"; out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi
	@echo "==> go vet"; $(GO) vet ./...
	@echo "==> staticcheck (staticcheck.conf: exported docs start with their name)"; $(TOOLS)/staticcheck ./...
	@echo "==> comments name only .go files that exist"; $(GO) run ./internal/lint/filerefs
	@echo "==> the docs cite only tests and files that exist"; $(GO) run ./internal/lint/docrefs
	@echo "==> builds outside Linux (an engine author's Mac)"; GOOS=darwin $(GO) build ./... && GOOS=freebsd $(GO) build ./...

.PHONY: sandbox-up
sandbox-up: ## start the throwaway Slurm and sshd in $(SANDBOX_DIR) (root)
	bash sandbox/up.sh $(SANDBOX_DIR)

.PHONY: sandbox-down
sandbox-down: ## stop the sandbox in $(SANDBOX_DIR) and delete its state
	bash sandbox/down.sh $(SANDBOX_DIR) --purge

# The tests that need most of the sandbox's 100 CPUs at once: 100
# workers through one relay, a burst of 40, the author job's 30 tasks.
# Beside the others (go test runs packages at once) each holds part of
# the CPUs while waiting for the rest, and two of them can starve each
# other until both time out; they run after the rest, one at a time.
WHOLE_SANDBOX_TESTS := ^(TestE2ERelayHundred|TestE2EBurstOf40|TestAuthorJob|TestMapReduce)$$
.PHONY: test
test: build lint fuzz ## lint, a short fuzz, then every test with -race, with the sandbox up when possible
	@bash sandbox/with-sandbox.sh $(SANDBOX_DIR) -- sh -c '$(GO) test -race -count=1 -timeout 20m -skip "$(WHOLE_SANDBOX_TESTS)" ./... && \
		echo "==> the tests that need the whole sandbox, one at a time" && \
		$(GO) test -race -count=1 -timeout 15m -p 1 -parallel 1 -run "$(WHOLE_SANDBOX_TESTS)" ./host-example/ ./examples/authorjob/ ./examples/mapreduce/'

# The tests that talk to Slurm, run again on each newer Slurm: the
# plugin's integration, refusal, reliability and version tests, the
# queue's commands against each release's output, the engine's runs (a
# need, a burst, multi-node, the relay, tasks, the profile chosen by a
# task's time, which reads the partitions' times), its preflight and its
# reliability, and the demo. Unit tests do not change with the
# Slurm a sandbox runs, and run once, in make test; so do the bastion's
# tests of ssh alone against the sandbox's sshd (TestBastionOnRealSSHD).
SLURM_TESTS_PLUGIN := Integration|Accounting|Refus|Reliability|SSHSandbox|SbatchReads|BareArray|Deadline|ReleaseMismatch|LoginPath|SubmitRule
SLURM_TESTS_ENGINE := TestE2ERunServesNeeds|TestE2EBurstWithinSubmitLimit|TestE2EBurstOneSubmission|TestE2EMultiNode|TestE2ERelay$$|TestE2ERelayRecovers|TestE2ERelayTwoLogins|TestValidateCheck|TestScriptCommand|TestReliability|TestE2ESigtermCancelsJobs|TestE2ECleanStop|TestE2ERunTasks|TestE2ETaskRunsAgain|TestE2EJobKilledUnderItsTask|TestE2EWalltime|TestE2ENodeDownUnderATask|TestE2EPendingReasonShown|TestValidateProbe|TestE2EReload|TestE2ERateLimitedBurst|TestE2ETimeChoosesLongEnoughProfile|TestE2ETooLongRefusedBeforeAsking|TestE2ELogDirLeftAsFound|TestE2ESlots|TestE2EExclusiveWholeNode
# One go test runs the plugin's and the engine's together, so that the
# two packages share the run's wall time, as they do in make test. The
# plugin's patterns also match these of the engine's, which need no
# second Slurm: the login refusal is ssh's, the others use no Slurm.
SLURM_TESTS_NOT_AGAIN := TestLoginRefusedStopsKnocking|TestE2EForgedTokenRefused|TestReadTasksRefuses
.PHONY: test-slurm
test-slurm: build ## the Slurm-facing tests and the demo against SANDBOX_SLURM's sandbox (no -race)
	@bash sandbox/with-sandbox.sh $(SANDBOX_DIR) -- bash -c 'set -e; t0=$$SECONDS; \
		echo "==> Slurm-facing tests on Slurm $${SANDBOX_SLURM_VERSION:-?} ($(SANDBOX_SLURM))"; \
		$(GO) test -count=1 -timeout 30m -run "$(SLURM_TESTS_PLUGIN)|$(SLURM_TESTS_ENGINE)" -skip "$(SLURM_TESTS_NOT_AGAIN)" \
			./slurm/ ./slurm/sshrun/ ./slurm/internal/queue/ ./host-example/; \
		$(GO) test -count=1 -timeout 10m ./examples/embed/ ./examples/authorjob/ ./examples/mapreduce/; \
		DEMO_LINGER=0 bash sandbox/demo.sh; \
		echo "==> Slurm $${SANDBOX_SLURM_VERSION:-?} ($(SANDBOX_SLURM)): passed in $$((SECONDS - t0)) s"'

.PHONY: test-versions
test-versions: ## test-slurm on Slurm 24.11 (trixie) and 26.05 (sid), one after the other
	@for s in trixie sid; do $(MAKE) --no-print-directory test-slurm SANDBOX_SLURM=$$s SANDBOX_DIR=/tmp/pvsb-$$s || exit 1; done

# Each fuzz target runs briefly on every `make test`, from its committed
# seeds; run one for longer with e.g. FUZZTIME=10m make fuzz.
FUZZTIME ?= 5s
FUZZ_TARGETS := engine/hclconfig:FuzzDecodeConfig slurm:FuzzParseJobID slurm/sbatch:FuzzSqueueID slurm:FuzzConfigAndScript engine/host:FuzzVerify
.PHONY: fuzz
fuzz: ## run each fuzz target for $(FUZZTIME) (FUZZTIME=10m make fuzz for longer)
	@log=$$(mktemp); trap 'rm -f $$log' EXIT; \
	for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "==> fuzz $$fn ($$pkg, $(FUZZTIME))"; \
		for try in 1 2; do \
			if $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) ./$$pkg >$$log 2>&1; then break; fi; \
			tail -20 $$log | sed 's/^/    /'; \
			if grep -q 'Failing input written' $$log || [ $$try = 2 ]; then exit 1; fi; \
			echo "    the fuzzer failed without a failing input (a worker crash, not a finding); once more"; \
		done; \
	done

.PHONY: demo
demo: build ## the whole loop against a throwaway local Slurm, told as a story
	@bash sandbox/demo.sh

# The report runs bench/'s TestBenchReport, which takes every measurement
# once and prints one table; `go -C bench test` (no package argument)
# streams its progress. The Go benchmarks themselves: go test -bench . ./bench
.PHONY: bench
bench: build ## benchmarks beside their baselines; writes docs/benchmarks.md
	@bash sandbox/with-sandbox.sh $(SANDBOX_DIR) -- env BENCH_REPORT=1 $(GO) -C bench test -count=1 -run '^TestBenchReport$$' -timeout 25m

# The soak (soak/): SOAK of bursts and a seeded nemesis against the
# sandbox, invariants checked every second; SOAK_SEED=N replays a run's
# schedule; SOAK_RACE=0 builds the engine and the plugin without -race
# (then RSS is judged beside the live heaps); SOAK_PPROF=DIR keeps the
# plugins' heap profiles at the start and the end. Writes docs/soak.md;
# fails on any invariant's violation.
SOAK ?= 3m
SOAK_SEED ?=
SOAK_RACE ?= 1
SOAK_PPROF ?=
.PHONY: soak
soak: build ## the seeded soak: SOAK (3m) of bursts and faults against the sandbox; writes docs/soak.md
	@bash sandbox/with-sandbox.sh $(SANDBOX_DIR) -- env SOAK_RUN=1 SOAK_REPORT=1 SOAK=$(SOAK) SOAK_SEED=$(SOAK_SEED) \
		SOAK_RACE=$(SOAK_RACE) SOAK_PPROF=$(SOAK_PPROF) \
		$(GO) test -count=1 -v -run '^TestSoak$$' -timeout 3h ./soak/

.PHONY: clean
clean: ## remove bin/
	rm -rf $(BIN)
