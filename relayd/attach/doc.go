// Package attach is client-side egress: the `client` route of kl's policies. A person
// who deployed workloads holds a live session (`kl-ctl attach`) to a node's kl-relayd;
// the flows the relay routes `client` for the workloads that session may carry cross it
// and leave from the person's own machine (their VPN, corporate proxy, isolated lab).
//
// Both ends live here. The daemon side (Server) runs the attach listener, off unless the
// daemon's settings configure it: TLS 1.3 with the daemon's certificate, then
// authentication by bearer token or client certificate against configured credentials,
// each granting workloads by id or label selector. Connections not authenticated yet are
// bounded, in all and per source address (an IPv6 /64), and one over a bound evicts the
// oldest pending one (of its source, else of the busiest source) rather than being
// refused, so silent connections cannot lock operators out; one that sends nothing for
// 3 seconds is closed, and none outlives Serve. It keeps the registry of live sessions
// (Live, Sessions) and is the relay's `client` exit (Exit, Dial): one multiplexed stream
// (hashicorp/yamux, over the one TLS connection) per flow, opened by a Header carrying the
// destination, the flow's whole decision context (timestamp, id, labels, image, process,
// hostname, source) and the version of the policy that decided it (an earlier one than
// the live policy when a reload landed in between: the session is sent it, marked so it
// does not replace the current one). No live session for the workload means the
// flow is refused with the reason, never sent by another exit.
//
// The attach side (Client) receives the policy's bytes when the session starts and after
// every reload, parses them with package rules exactly as the daemon did, and decides
// every flow again from the header's inputs (a script's Date and Math.random derive from
// the flow's timestamp and id, so the answer is the same). A flow whose route it would not
// have chosen, under a policy version it does not hold, or of a workload outside what it
// asked to carry is refused with a Verdict code: a compromised workload cannot promote a
// flow to the operator's network, and a node cannot send a flow its own policy would not
// route here. The policy itself comes from the node, so the attach side trusts the node
// for it: a compromised node could send a policy that routes every granted workload's
// flows `client`. What bounds that is the session's grant (which workloads) and the
// person's own network, not a policy pinned on this side. Accepted flows are dialled from this side's
// network: through the proxy the PAC named (`PROXY host:port`), else through the proxy
// its own environment names (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY), else
// directly, resolving hostnames here (a hostname only when this side's own decision
// rested on it, as the relay hands its exits the name; else the address that was checked); never into this machine itself (its loopback,
// link-local and unspecified addresses, also in the forms getaddrinfo reads as one, such
// as 127.1; and, since a proxy resolves names out of this side's sight, every name
// handed to one that is not well-formed: refused with E_LOCAL) unless the operator lends
// those too (ClientOptions.AllowLocal, kl-ctl attach --allow-local: a tunnel on
// localhost). The verdict is sent only after that dial, so the
// workload sees a refused connection exactly when this side could not connect; and a
// flow the session's end cuts off is reset on the workload's side, never ended as if
// the destination had finished.
//
// Compared with mirrord's outgoing traffic and Telepresence: those move a process's
// traffic between a laptop and a cluster by injecting an agent into the pod or replacing
// the workload; here nothing is injected and the workload keeps running unchanged, the
// route is chosen per flow by the audited policy, the session is bound to explicitly
// granted workloads, and the operator's side re-checks every flow instead of trusting the
// cluster.
//
// It is not the relay (package relay decides and splices flows), the rule engine, or the
// command line (relayd/ctl/attach.go): those call it.
package attach
