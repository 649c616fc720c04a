// Package netns is the only part of kl that enters network namespaces: it runs code in
// a pod's netns on a locked OS thread, opens listeners and marked dial sockets that live
// in that netns, reads a redirected connection's original destination, and programs,
// verifies and removes the pod's nftables capture table ("inet kl").
//
// The capture table may also carry a pod's kernel decisions (Decisions, issue 9): an
// ordered list of destination prefixes and ports whose flows the kernel accepts itself,
// tagging each connection with a conntrack mark, or sends to the relay. They compile to
// interval mark maps and sets between the exemptions and the redirect, installed with
// the capture in one transaction (InstallDecisions); Verify checks the capture under
// them, VerifyDecisions the whole table, Installed reads the capture back.
//
// It is not a policy engine: it does not decide where a flow goes, and it never touches
// the host's own ruleset. Everything kernel-facing lives in *_linux.go files; on other
// systems the functions return errors.ErrUnsupported so the rest of kl still vets.
package netns
