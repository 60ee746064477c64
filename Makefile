# raid5d — `make` lists the targets.
GO        ?= go
BIN       := bin/raid5d
PKGS      := ./...
UNIT_PKGS := ./parity/... ./stripe/... ./raid/... ./nbd/... ./cmd/... ./internal/...
# Debian packages the end-to-end tests drive: real NBD clients, a filesystem, FUSE; and for the
# VM tests (test/vm) qemu, busybox, the kernel's nbd client, mdadm (the kernel image itself is
# fetched by the tests with apt-get download into test/vm/.cache).
DEB_PKGS  := fio libnbd-bin nbdkit nbd-server qemu-utils fuse3 e2fsprogs qemu-system-x86 busybox-static nbd-client mdadm xz-utils iproute2
FUZZTIME  ?= 20s
# make test fuzzes each target for a count of inputs, not a duration: with a duration, Go 1.26's
# fuzzing coordinator can report its own deadline as a failure ("context deadline exceeded", no
# crasher written; go.dev/issue/75804, fixed in Go 1.27), which it did in a clean-clone CI run.
TEST_FUZZTIME ?= 50000x
# make run: a default array of four sparse member files under ./data, served on loopback.
DATA      ?= data
RUN_SIZE  ?= 256M
PROFILE_DIR ?= test/vm/.cache/profile
MEMBERS   := $(foreach i,0 1 2 3,$(DATA)/member$(i).img)
LISTEN    ?= 127.0.0.1:10809

# make stress: the concurrency-heavy unit tests (member failure, rebuild, the stripe cache, the
# journal, power cuts, pinned buffers, NBD transmission and shutdown), STRESS_COUNT times, then
# STRESS_RACE_COUNT times with the race detector. make test runs a short pass (the _SHORT counts).
STRESS_COUNT            ?= 30
STRESS_RACE_COUNT       ?= 5
STRESS_SHORT_COUNT      ?= 5
STRESS_SHORT_RACE_COUNT ?= 1
STRESS_PKGS  := ./raid ./raid/internal/bitmap ./raid/internal/journal ./stripe/cache ./nbd
STRESS_TESTS := \
  TestDoubleFailure TestWriteFailure TestUnrecordedFailure TestFailureDrainsWrites TestFailedArrayReleasesPins \
  TestRebuild TestRebuildResume TestFailDuringRebuild TestForceDuringRebuild TestScrubDuringResync \
  TestHungMember TestHungMembersFailArray \
  TestPinnedRelease TestWriteDuringWriteOut TestOverlapStress TestHazard TestBatching TestReadYourWrites \
  TestWriteOutError TestFUA TestStripeLocks TestReadMappedClose TestModel \
  TestPowerCut TestJournalWrap TestJournalDegradedPowerCut TestVolatileConcurrent TestGroupCommit TestRingFull \
  TestCacheDirty TestCacheRandom TestCacheDegradedPlan \
  TestStablePages TestStablePagesBound TestStablePagesErrors TestPipelining TestInFlightBytesBound \
  TestDiscDrainsWrites TestServeShutdownDrains TestServeShutdownTimeout TestMixedWriteSizes TestServeClients \
  TestBudget TestBudgetShares TestBudgetLane TestMaxTotalInFlightBytes TestLargeWritesShareBudget TestStalledPayloads \
  TestPayloadDeadlineWaitsForBudget
empty :=
space := $(empty) $(empty)
STRESS_RUN := ^($(subst $(space),|,$(strip $(STRESS_TESTS))))$$

.DEFAULT_GOAL := help
.PHONY: help build run test test-unit test-e2e test-vm bench-vm bench-vm-remote profile-vm stress fuzz bench bench-peers benchcmp lint deps clean

help: ## list the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-z][a-zA-Z0-9_-]*:.*## /{printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## build bin/raid5d
	$(GO) build -o $(BIN) ./cmd/raid5d

run: build ## build, create ./data/member{0..3}.img (4 x 256M, sparse) if absent, serve on 127.0.0.1:10809
	@mkdir -p $(DATA)
	@if [ ! -e $(DATA)/member0.img ] && [ ! -e $(DATA)/member1.img ]; then \
	  ./$(BIN) create --size $(RUN_SIZE) $(MEMBERS); fi
	@echo "attach:  nbdinfo nbd://$(LISTEN)   |   nbd-client -b 4096 $(subst :, ,$(LISTEN)) /dev/nbd0   |   see README"
	./$(BIN) serve --listen $(LISTEN) $(MEMBERS)

test: deps lint ## install what the tests need, then run every test (unit with -race, the model test under the invariants tag, end-to-end, a short stress pass, each fuzz target briefly)
	$(GO) test -race -count=1 $(UNIT_PKGS)
	$(GO) test -tags invariants -count=1 -run 'TestModel|TestInvariants' ./raid ./stripe/...
	RAID5D_REQUIRE_TOOLS=$${RAID5D_REQUIRE_TOOLS-$${CI:+1}} $(GO) test -count=1 -timeout 20m $$($(GO) list ./test/... | grep -v /test/vm)
	RAID5D_REQUIRE_TOOLS=$${RAID5D_REQUIRE_TOOLS-$${CI:+1}} $(GO) test -count=1 -timeout 25m ./test/vm
	$(MAKE) --no-print-directory stress STRESS_COUNT=$(STRESS_SHORT_COUNT) STRESS_RACE_COUNT=$(STRESS_SHORT_RACE_COUNT)
	$(MAKE) --no-print-directory fuzz FUZZTIME=$(TEST_FUZZTIME)

test-unit: ## unit tests only, with the race detector
	$(GO) test -race -count=1 $(UNIT_PKGS)

test-e2e: deps ## end-to-end tests with real clients (fio, nbdinfo, qemu-io, nbdfuse)
	$(GO) test -count=1 -v -timeout 20m $$($(GO) list ./test/... | grep -v /test/vm)

test-vm: deps ## boot a Debian kernel in qemu: the kernel nbd client on raid5d (make test runs this part), then bench-vm and bench-vm-remote
	RAID5D_REQUIRE_TOOLS=$${RAID5D_REQUIRE_TOOLS-1} $(GO) test -count=1 -v -timeout 25m ./test/vm
	$(MAKE) --no-print-directory bench-vm
	$(MAKE) --no-print-directory bench-vm-remote

bench-vm: deps ## in one VM boot, md RAID-5 vs raid5d vs md+nbdkit on 4 RAM disks, kernel nbd client, fio: one table
	RAID5D_VM_BENCH=1 RAID5D_REQUIRE_TOOLS=$${RAID5D_REQUIRE_TOOLS-1} $(GO) test -count=1 -v -timeout 60m -run '^TestBench$$' ./test/vm

bench-vm-remote: deps ## in one VM boot, 4 nbdkit member servers: md RAID-5 over nbd-client devices vs raid5d with nbd:// members, one table
	RAID5D_VM_BENCH=1 RAID5D_REQUIRE_TOOLS=$${RAID5D_REQUIRE_TOOLS-1} $(GO) test -count=1 -v -timeout 60m -run '^TestBenchRemote$$' ./test/vm

profile-vm: deps ## where raid5d's time goes behind the kernel client: CPU per request, nbd-client -C 1/2/4, pprof (PROFILE_DIR)
	RAID5D_VM_PROFILE=$(abspath $(PROFILE_DIR)) RAID5D_REQUIRE_TOOLS=$${RAID5D_REQUIRE_TOOLS-1} $(GO) test -count=1 -v -timeout 40m -run '^TestProfile$$' ./test/vm

stress: ## the concurrency-heavy unit tests STRESS_COUNT times (30), then STRESS_RACE_COUNT times with -race (5)
	$(GO) test -short -count=$(STRESS_COUNT) -timeout 60m -run '$(STRESS_RUN)' $(STRESS_PKGS)
	$(GO) test -short -race -count=$(STRESS_RACE_COUNT) -timeout 60m -run '$(STRESS_RUN)' $(STRESS_PKGS)

# package:target pairs for `make fuzz`; package:target:COUNT runs that target for COUNT inputs
# instead of TEST_FUZZTIME's under make test (a slow target: FuzzConfigFile runs the whole
# command line twice per input, a few hundred a second).
FUZZ_TARGETS := stripe:FuzzExtents nbd:FuzzRequestHeader nbd:FuzzHandshake raid:FuzzDecodeSuperblock raid/internal/journal:FuzzJournalRecord \
                cmd/raid5d/internal/loadgen:FuzzDecodeHeader nbd/client:FuzzServerStream nbd/client:FuzzParseURI \
                cmd/raid5d:FuzzConfigFile:3000x

fuzz: ## run each fuzz target for FUZZTIME (default 20s)
	@set -e; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; fn=$${t#*:}; time=$(FUZZTIME); \
	  case $$fn in *:*) [ "$(FUZZTIME)" = "$(TEST_FUZZTIME)" ] && time=$${fn#*:}; fn=$${fn%%:*};; esac; \
	  echo "== $$pkg $$fn"; \
	  $(GO) test ./$$pkg -run '^$$' -fuzz "^$$fn\$$" -fuzztime $$time; \
	done

bench-peers: ## raid5d vs nbdkit file/null, nbd-server and go-nbd's file backend: same fio jobs (test/fio/peers), one table
	@if ! command -v nbd-server >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO=sudo; fi; \
	  echo "installing: nbd-server"; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nbd-server >/dev/null || exit 1; \
	fi
	test/bench/peers.sh

bench: ## Go benchmarks of the hot paths
	$(GO) test -run '^$$' -bench . -benchmem $(UNIT_PKGS)

benchcmp: ## Go benchmarks of the working tree vs BASE=ref, alternating runs, benchstat (COUNT, BENCH, BENCH_PKGS)
	@test -n "$(BASE)" || { echo "usage: make benchcmp BASE=ref"; exit 2; }
	test/bench/benchcmp.sh $(BASE)

lint: ## gofmt and go vet
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

deps: ## install the Debian packages the tests use (idempotent, quiet)
	@if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO=sudo; fi; \
	missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $$SUDO apt-get update -qq >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null || exit 1; \
	fi; \
	if ! command -v nbdfuse >/dev/null; then \
	  echo "installing: nbdfuse"; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nbdfuse >/dev/null || exit 1; \
	fi
	@$(GO) mod download

clean: ## remove build output
	rm -rf bin
