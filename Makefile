# understudy — every entry point a developer or CI needs.
GO        ?= go
TAGS      := libvirt_dlopen
BIN       := bin/understudy
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X understudy/runtime.Version=$(VERSION)
BENCH     ?= .
BENCHTIME ?= 1s

.PHONY: all build run test test-deps lint bench bench-sidebyside clean

all: build

# Two binaries: understudy, and understudy-libvirt beside it — the process
# that runs understudy's libvirt calls (the only one linking libvirt).
build:
	$(GO) build -tags $(TAGS) -ldflags '$(LDFLAGS)' -o bin/ ./cmd/understudy ./cmd/understudy-libvirt

# The main job on the embedded default NATS, nothing to set up: a failover
# pair whose primary loses power; the replica takes over.
run: build
	./$(BIN) demo

# Installs what the tests need (idempotent), lints, then runs every test
# under the race detector.
test: test-deps lint
	$(GO) test -tags $(TAGS) -race -count=1 -timeout 20m ./...

test-deps:
	./scripts/install-test-deps.sh

# The many-pairs harness is a module of its own (benchmarks/pairs/doc.go):
# ./... does not reach it, so it is vetted in its folder, where its go.mod
# must keep up with the root's.
lint:
	@out=$$(gofmt -l .); \
	  if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet -tags $(TAGS) ./...
	$(GO) tool staticcheck -tags $(TAGS) ./...
	cd benchmarks/pairs && $(GO) vet -tags $(TAGS) . && $(GO) tool staticcheck -tags $(TAGS) .

# Benchmarks with their references in the same run; figures go to
# docs/benchmarks.md. BENCH selects, BENCHTIME sets -benchtime.
bench:
	$(GO) test -tags $(TAGS) -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem -timeout 60m ./...

# understudy vs Patroni, one run (about 30 minutes; needs root): the same
# two PostgreSQL 15 servers, writer and kill -9 for each, 15 kills per
# profile; installs Patroni and etcd. KILLS=3 for a quick look.
bench-sidebyside:
	./scripts/bench-sidebyside.sh

clean:
	rm -rf bin

# Many pairs over two member nodes and one store (issue 16): a steady phase
# with no fault, and with KILL=1 the death of the node leading every pair.
# PAIRS ("300 600"), MODE (per-pair|node|both), DURATION (60s), KILL, REV:
# see scripts/bench-pairs.sh.
.PHONY: bench-pairs
bench-pairs:
	./scripts/bench-pairs.sh
