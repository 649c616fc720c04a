#!/usr/bin/env bash
# Installs what kl's tests, benchmarks and demo need, idempotently: Debian packages,
# the CNI reference plugins and cnitool (built from the Go module proxy). Safe to run
# again; does nothing that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(nftables iproute2 conntrack runc containerd docker.io squid dante-server microsocks
      redsocks iperf3 wrk python3-pacparser busybox-static curl socat ncat jq procps psmisc
      systemd patch)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "deps: missing Debian packages (${missing[*]}); run as root to install them" >&2
	else
		echo "deps: installing ${missing[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		# Daemons must not start on install: tests start their own instances.
		printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
		rm -f /usr/sbin/policy-rc.d
	fi
fi

# CNI reference plugins and cnitool, pinned.
cni=.build/cni
want="bridge host-local loopback portmap"
have=1
for p in $want cnitool; do [ -x "$cni/$p" ] || have=0; done
if [ $have = 0 ]; then
	echo "deps: building CNI plugins v1.10.0 and cnitool v1.3.1"
	mkdir -p "$cni"
	for p in main/bridge main/loopback meta/portmap ipam/host-local; do
		GOBIN="$PWD/$cni" GOFLAGS=-buildvcs=false go install "github.com/containernetworking/plugins/plugins/$p@v1.10.0"
	done
	GOBIN="$PWD/$cni" GOFLAGS=-buildvcs=false go install "github.com/containernetworking/cni/cnitool@v1.3.1"
fi
