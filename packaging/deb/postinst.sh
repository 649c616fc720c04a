#!/bin/sh
# kl postinst. Enables kl-relayd; starts (or restarts) it only on a host booted with
# systemd. In a chroot, an image build or a container there is no running systemd, and
# with DPKG_ROOT set (dpkg --root with chrootless scripts) this is not the live system,
# so nothing is started. policy-rc.d is honoured through deb-systemd-invoke.
set -e

case "$1" in
configure | abort-upgrade | abort-deconfigure | abort-remove)
	if [ -n "${DPKG_ROOT:-}" ]; then
		exit 0
	fi
	if command -v deb-systemd-helper >/dev/null 2>&1; then
		deb-systemd-helper unmask kl-relayd.service >/dev/null || true
		if deb-systemd-helper --quiet was-enabled kl-relayd.service; then
			deb-systemd-helper enable kl-relayd.service >/dev/null || true
		else
			deb-systemd-helper update-state kl-relayd.service >/dev/null || true
			deb-systemd-helper enable kl-relayd.service >/dev/null || true
		fi
	fi
	if [ -d /run/systemd/system ]; then
		systemctl --system daemon-reload >/dev/null || true
		if [ -n "$2" ]; then
			deb-systemd-invoke try-restart kl-relayd.service >/dev/null || true
		else
			deb-systemd-invoke start kl-relayd.service >/dev/null || true
		fi
	fi
	;;
esac
exit 0
