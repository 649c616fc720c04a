#!/usr/bin/env bash
# Runs every Fuzz target of the module for FUZZTIME each (seed corpora live in testdata/fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
for pkg in $(go list ./...); do
	for fn in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
		echo "== $pkg $fn"
		go test -run '^$' -fuzz "^${fn}\$" -fuzztime "${FUZZTIME:-20s}" "$pkg"
	done
done
