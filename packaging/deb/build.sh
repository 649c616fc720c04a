#!/bin/sh
# Builds the kl Debian package: .build/kl_<version>_amd64.deb.
#
# Binaries are built static (CGO_ENABLED=0) from this tree; nfpm runs from the Go module
# proxy at a pinned version (it is not a dependency of the module). Environment:
#   KL_VERSION   package version (default 0.1.0)
#   KL_DEB_BIN   take the five binaries from this directory instead of building them
#   KL_DEB_OUT   output directory (default .build)
set -eu

NFPM="github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.44.2"
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

KL_VERSION=${KL_VERSION:-0.1.0}
out=${KL_DEB_OUT:-$root/.build}
stage=$(mktemp -d "${TMPDIR:-/tmp}/kl-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT INT TERM
export KL_VERSION

bins="kl-relayd kl-ctl kl-runtime kl-hook kl-cni"
mkdir -p "$stage/bin" "$out"
if [ -n "${KL_DEB_BIN:-}" ]; then
	for b in $bins; do cp "$KL_DEB_BIN/$b" "$stage/bin/$b"; done
else
	echo "building static binaries" >&2
	pkgs=""
	for b in $bins; do
		dir=$(find relayd plugins shim -maxdepth 1 -type d -name "$b" | head -n 1)
		if [ -z "$dir" ]; then
			echo "build.sh: no main package for $b under relayd/, plugins/ or shim/" >&2
			exit 1
		fi
		pkgs="$pkgs ./$dir"
	done
	# shellcheck disable=SC2086 # word splitting of the package list is intended
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -buildvcs=false \
		-ldflags "-s -w" -o "$stage/bin/" $pkgs
fi

# Snippets for wiring kl in by hand, and the manifests, under /usr/share/kl.
for d in cni containerd docker k8s; do
	mkdir -p "$stage/share/$d"
	[ -d "packaging/$d" ] || continue
	find "packaging/$d" -maxdepth 1 -type f \
		\( -name '*.conflist' -o -name '*.conf' -o -name '*.json' -o -name '*.toml' -o -name '*.yaml' -o -name '*.md' \) \
		-exec cp {} "$stage/share/$d/" \;
done
mkdir -p "$stage/doc"
cp README.md "$stage/doc/"
find docs -maxdepth 1 -type f -name '*.md' -exec cp {} "$stage/doc/" \;
find "$stage/share" "$stage/doc" -type f -exec chmod 0644 {} +
find "$stage/share" "$stage/doc" -type d -exec chmod 0755 {} +

cp packaging/systemd/kl-relayd.service packaging/deb/rules.yaml packaging/deb/relayd.yaml packaging/deb/runtime.yaml \
	packaging/deb/kl-relayd.default packaging/deb/postinst.sh packaging/deb/prerm.sh \
	packaging/deb/postrm.sh "$stage/"

deb="$out/kl_${KL_VERSION}_amd64.deb"
echo "packaging $deb with nfpm" >&2
(cd "$stage" && go run "$NFPM" package --config "$root/packaging/deb/nfpm.yaml" --packager deb --target "$deb" >&2)
echo "$deb"
