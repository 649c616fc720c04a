#!/usr/bin/env bash
# `make demo-explain`: a walk through kl's rule engine with kl-ctl over the example files.
# make builds first; the binaries are in $KL_BIN (default .build/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${KL_BIN:-$PWD/.build/bin}
CTL="$BIN/kl-ctl"
if [ ! -x "$CTL" ]; then
	echo "demo: $CTL not found; run 'make demo' (it builds first) or 'make build'" >&2
	exit 1
fi

bold=$'\e[1m' dim=$'\e[2m' off=$'\e[0m'
[ -t 1 ] || { bold='' dim='' off=''; }

say() { printf '\n%s== %s%s\n' "$bold" "$*" "$off"; }
note() { printf '%s%s%s\n' "$dim" "$*" "$off"; }
run() {
	printf '%s$ kl-ctl %s%s\n' "$bold" "$*" "$off"
	"$CTL" "$@" || printf '%s(exit status %d)%s\n' "$dim" "$?" "$off"
	echo
}

say "1. CI builder (examples/ci-builder.yaml)"
note "The builder image goes through the acceleration proxy as a whole; the internal registry stays direct."
sed -n '/^default:/,$p' examples/ci-builder.yaml
run explain --rules examples/ci-builder.yaml \
	--image registry.cn-hangzhou.aliyuncs.com/acme/builder/go:1.22 --host proxy.golang.org --port 443
note "Even to the internal network, the builder takes the proxy: the image tier (200) is tried before cidr (500)."
run explain --rules examples/ci-builder.yaml \
	--image registry.cn-hangzhou.aliyuncs.com/acme/builder/go:1.22 --ip 10.1.2.3 --port 443
note "Another image reaching the internal registry goes direct:"
run explain --rules examples/ci-builder.yaml --image nginx --ip 10.1.2.3 --port 5000 --json
note "Cloud metadata always goes direct, whatever the rules say (the metadata guard):"
run explain --rules examples/ci-builder.yaml \
	--image registry.cn-hangzhou.aliyuncs.com/acme/builder/go:1.22 --ip 169.254.169.254 --port 80

say "2. Several exits by label (examples/multi-exit.yaml)"
sed -n '/^default:/,$p' examples/multi-exit.yaml
for route in proxy proxy-b direct; do
	run explain --rules examples/multi-exit.yaml --label kl.route=$route --host registry.npmjs.org --port 443 --json
done
note "Unlabelled workloads take the default:"
run explain --rules examples/multi-exit.yaml --host registry.npmjs.org --port 443 --json

say "3. Forced-direct base (examples/forced-direct.yaml)"
note "Everything goes through the proxy except what is listed."
sed -n '/^default:/,$p' examples/forced-direct.yaml
run explain --rules examples/forced-direct.yaml --host github.com --ip 140.82.112.3 --port 443
run explain --rules examples/forced-direct.yaml --host API.Default.svc.cluster.local. --ip 10.96.0.10 --port 443
note "lint loads the file as the daemon would and warns about likely mistakes:"
run lint examples/forced-direct.yaml

say "4. The pattern form (examples/pattern.yaml), and the same from flags"
sed -n '/^mode:/,$p' examples/pattern.yaml
run explain --rules examples/pattern.yaml --host git.corp.example --ip 10.1.2.3 --port 22
run explain --egress-route '*.corp.example=client' --egress-route '10.0.0.0/8=cluster' \
	--egress-default deny --host example.org --port 443 --json
note "gateway is refused unless the node opted in with KL_EGRESS_GATEWAY=1:"
run explain --egress-route 'api.example.com:443=gateway' --host api.example.com --port 443 --json
KL_EGRESS_GATEWAY=1 run explain --egress-route 'api.example.com:443=gateway' --host api.example.com --port 443 --json
note "A policy for detached use cannot route to client:"
run lint --detached examples/pattern.yaml

say "5. Bad input is refused with a reason code, the rule and the line"
bad=$(mktemp)
trap 'rm -f "$bad"' EXIT
printf 'default: direct\nrules:\n  - domain: "*.example.com"\n    cidr: 10.0.0.0/8\n    action: proxy\n' >"$bad"
cat "$bad"
run lint "$bad"

note "Done. Write your own rules with docs/rules.md; reason codes are in docs/reason-codes.md."
