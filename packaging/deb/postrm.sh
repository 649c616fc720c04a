#!/bin/sh
# kl postrm: forget the unit; on purge also the state, audit logs and enablement.
set -e

if [ -n "${DPKG_ROOT:-}" ]; then
	root="$DPKG_ROOT"
else
	root=""
fi

if [ -z "$root" ] && [ -d /run/systemd/system ]; then
	systemctl --system daemon-reload >/dev/null || true
fi

case "$1" in
remove)
	if [ -z "$root" ] && command -v deb-systemd-helper >/dev/null 2>&1; then
		deb-systemd-helper mask kl-relayd.service >/dev/null || true
	fi
	;;
purge)
	if [ -z "$root" ] && command -v deb-systemd-helper >/dev/null 2>&1; then
		deb-systemd-helper purge kl-relayd.service >/dev/null || true
		deb-systemd-helper unmask kl-relayd.service >/dev/null || true
	fi
	rm -rf "$root/var/lib/kl" "$root/var/log/kl" "$root/run/kl"
	;;
esac
exit 0
