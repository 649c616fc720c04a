// Package systemd holds kl-relayd's systemd unit (kl-relayd.service). The Go package
// exists for its tests, which check the unit with systemd's own tools
// (systemd-analyze verify and security) and run the real daemon with the unit's command
// line. It has no code the product imports.
package systemd
