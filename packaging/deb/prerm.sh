#!/bin/sh
# kl prerm: stop the relay before its files go away (only where systemd runs).
# Pods whose capture is still installed then have no egress until kl is reinstalled
# or their sandboxes are recreated without kl: remove kl from the CNI and runtime
# configuration first (kl-ctl uninstall cni|containerd|docker).
set -e

if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ] && [ "$1" = remove ]; then
	deb-systemd-invoke stop kl-relayd.service >/dev/null || true
fi
exit 0
