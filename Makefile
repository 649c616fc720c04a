# kl: `make demo` shows it working, `make test` runs everything (installing its own
# dependencies), `make bench` measures it against the alternatives.
GO      ?= go
BIN     := $(CURDIR)/.build/bin
export KL_BIN := $(BIN)
export KL_CNI_BIN := $(CURDIR)/.build/cni
export GOFLAGS := -buildvcs=false

.PHONY: all build deps test unit vet fuzz bench demo demo-explain package clean

all: build

# The binaries are built as they ship (packaging/deb/build.sh): static, without cgo,
# stripped. A CNI plugin is exec'd for every sandbox, and a static binary starts about
# 3 ms sooner than one linked against libc.
build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o $(BIN)/ ./...

deps:
	@tests/deps.sh

vet:
	$(GO) vet ./...
	GOOS=darwin $(GO) vet ./...

# Everything: unit, fuzz seed corpora, and end-to-end tests against real kernels,
# runtimes and proxies (they skip without root unless KL_E2E=1, where they fail).
test: deps build vet
	$(GO) test -count=1 -timeout 25m ./...

unit:
	$(GO) test -count=1 -short ./...

# Short fuzzing bursts of every parser of untrusted input (the seed corpora also run in `make test`).
FUZZTIME ?= 20s
fuzz:
	FUZZTIME=$(FUZZTIME) tests/fuzz.sh

bench: deps build
	$(GO) run ./tests/bench

# A live demo node on this machine (root): CNI pods, a containerd container through
# kl-runtime, squid exits, destination hosts, all in network namespaces of its own.
demo: build
	@$(GO) run ./tests/demo

# A walk through kl-ctl explain over the example files (no root needed).
demo-explain: build
	@examples/demo.sh

# .build/kl_$(KL_VERSION)_amd64.deb: static binaries, unit, configs and snippets (nfpm from the module proxy).
package:
	packaging/deb/build.sh

clean:
	rm -rf .build
