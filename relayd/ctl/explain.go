package ctl

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kl-egress/kl/relayd/fastpath"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/rules/pac"
)

func init() {
	Register(Command{Name: "explain", Summary: "dry-run one connection through a policy and say which rule decides", Run: explain})
}

func explain(ctx context.Context, env *Env, args []string) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	var pf policyFlags
	pf.register(fs, true)
	var labels multiFlag
	fs.Var(&labels, "label", "a workload label `K=V` (repeatable)")
	image := fs.String("image", "", "the workload's image `REF`")
	process := fs.String("process", "", "the connecting process `NAME` (comm, exe and argv0)")
	host := fs.String("host", "", "the destination host `NAME`")
	ip := fs.String("ip", "", "the destination `ADDR`")
	port := fs.Uint("port", 0, "the destination port `N`")
	at := fs.String("at", "", "the flow's time, `RFC3339` (scripts' Date; default now)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: kl-ctl explain (--rules FILE | --egress-route PATTERN=ROUTE... [--egress-default ROUTE]) [--label K=V]... [--image REF] [--process NAME] [--host NAME] [--ip ADDR] [--port N] [--at RFC3339] [--json]")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(env, fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError(env, "explain", "unexpected argument %q (the rules file goes in --rules)", pos[0])
	}
	if strings.ContainsAny(*host, ":/") && !isAddrLiteral(*host) {
		return usageError(env, "explain", "--host %q: give the host name alone (the port goes in --port)", *host)
	}
	f := rules.Flow{Image: *image, Host: *host, At: time.Now()}
	if len(labels) > 0 {
		f.Labels = map[string]string{}
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			if k == "" {
				return usageError(env, "explain", "--label %q: want K=V", l)
			}
			f.Labels[k] = v
		}
	}
	if *process != "" {
		f.Process = rules.Process{Known: true, Comm: *process, Exe: *process, Argv0: *process}
	}
	var addr netip.Addr
	if *ip != "" {
		if addr, err = netip.ParseAddr(strings.Trim(*ip, "[]")); err != nil {
			return usageError(env, "explain", "--ip %q is not an address", *ip)
		}
	}
	if *port > 65535 {
		return usageError(env, "explain", "--port %d is not a port", *port)
	}
	f.Dst = netip.AddrPortFrom(addr, uint16(*port))
	if *at != "" {
		if f.At, err = time.Parse(time.RFC3339, *at); err != nil {
			return usageError(env, "explain", "--at %q: want RFC3339, e.g. 2026-01-02T15:04:05Z", *at)
		}
	}
	p, err := pf.load(env, "explain", pf.options(env, pf.detached))
	if err != nil {
		return err
	}
	d := p.Decide(&f)
	path, why := where(p, &f)
	if *asJSON {
		return writeDecisionJSON(env.Stdout, d, path)
	}
	explainWords(env.Stdout, p, &f, d, pf.source())
	fmt.Fprintf(env.Stdout, "\npath:   %s: %s\n", path, why)
	return nil
}

// where says where a transparent workload's flow is decided: "kernel" (the pod's
// nftables table accepts it; the relay never sees it, the conntrack watcher audits it)
// or "relay", and why. A flow known only by its hostname is the relay's.
func where(p *rules.Policy, f *rules.Flow) (string, string) {
	if !f.Dst.Addr().IsValid() {
		return "relay", "without a destination address (--ip) only the relay can decide it (the kernel sees addresses and ports)"
	}
	path, e := fastpath.Where(p, f.Labels, f.Image, f.Dst)
	switch {
	case e == nil:
		return path, "no kernel plan entry matches"
	case path == "kernel":
		return path, "a transparent pod's nftables table accepts it (" + e.String() + "); the relay never sees it, conntrack audits it"
	}
	return path, "the kernel plan sends it to the relay (" + e.String() + ")"
}

// decisionJSON is explain's --json contract: exit, rule, priority, dimension, note,
// and directive and proxy when a script decided (reason too when it failed).
type decisionJSON struct {
	Exit      string          `json:"exit"`
	Rule      int             `json:"rule"`
	Priority  int             `json:"priority"`
	Dimension rules.Dimension `json:"dimension"`
	Note      string          `json:"note"`
	Directive *string         `json:"directive,omitempty"`
	Proxy     *string         `json:"proxy,omitempty"`
	Reason    string          `json:"reason,omitempty"`
	// Path is where a transparent workload's flow is decided: "kernel" or "relay".
	Path string `json:"path"`
}

func writeDecisionJSON(w io.Writer, d rules.Decision, path string) error {
	out := decisionJSON{Exit: d.Exit, Rule: d.Rule, Priority: d.Priority, Dimension: d.Dimension, Note: d.Note, Path: path}
	if d.Dimension == rules.DimScript {
		out.Directive, out.Proxy, out.Reason = &d.Directive, &d.Proxy, d.Reason
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func describeFlow(f *rules.Flow) string {
	var parts []string
	if f.Host != "" {
		parts = append(parts, "host "+f.Host)
	}
	if f.Dst.Addr().IsValid() {
		parts = append(parts, "address "+f.Dst.Addr().String())
	}
	if f.Dst.Port() != 0 {
		parts = append(parts, "port "+strconv.Itoa(int(f.Dst.Port())))
	}
	if f.Image != "" {
		parts = append(parts, "image "+f.Image)
	}
	if f.Process.Known {
		parts = append(parts, "process "+f.Process.Comm)
	}
	if len(f.Labels) > 0 {
		keys := make([]string, 0, len(f.Labels))
		for k := range f.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for i, k := range keys {
			keys[i] = k + "=" + f.Labels[k]
		}
		parts = append(parts, "labels "+strings.Join(keys, ","))
	}
	if len(parts) == 0 {
		return "nothing known"
	}
	return strings.Join(parts, ", ")
}

func describeRule(r rules.RuleInfo) string {
	s := fmt.Sprintf("rule %d", r.Index)
	if r.Priority > 0 {
		s += fmt.Sprintf(" (%s tier, priority %d", r.Dimension, r.Priority)
	} else {
		s += " (pattern"
	}
	if r.Line > 0 {
		s += fmt.Sprintf(", line %d", r.Line)
	}
	s += fmt.Sprintf("): %s %q -> %s", r.Field, r.Value, r.Exit)
	if r.Note != "" {
		s += fmt.Sprintf(", note %q", r.Note)
	}
	return s
}

// isAddrLiteral says whether host is an IPv6 address (bare or in brackets), which has
// colons of its own.
func isAddrLiteral(host string) bool {
	_, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil
}

func explainWords(w io.Writer, p *rules.Policy, f *rules.Flow, d rules.Decision, file string) {
	form := "dimension form"
	switch {
	case p.HasScript():
		form = "PAC script"
	case p.PatternForm():
		form = "pattern form"
	}
	fmt.Fprintf(w, "policy: %s (%s, %s, default %s)\n", file, form, plural(p.Len(), "rule"), p.Default())
	fmt.Fprintf(w, "flow:   %s\n", describeFlow(f))
	fmt.Fprintf(w, "exit:   %s\n\n", d.Exit)
	switch d.Dimension {
	case rules.DimGuard:
		fmt.Fprintln(w, "Decided by the metadata guard: destinations in 169.254.0.0/16 and fd00:ec2::254 always go direct,")
		fmt.Fprintln(w, "before any rule, label or script is consulted.")
	case rules.DimScript:
		switch {
		case d.Reason != "" && d.Exit == rules.ExitDeny:
			fmt.Fprintf(w, "Decided by the script, which failed closed: %s.\n", d.Reason)
		case d.Directive == "":
			fmt.Fprintf(w, "Decided by the script, which returned no directive: the default (%s) applies.\n", d.Exit)
		default:
			fmt.Fprintf(w, "Decided by the script: FindProxyForURL returned %q, which routes to %s.\n", d.Directive, d.Exit)
		}
		if d.Proxy != "" {
			fmt.Fprintf(w, "The client side applies the proxy %s.\n", d.Proxy)
		}
		if path, why := p.ScriptPath(); path == pac.PathInline {
			fmt.Fprintln(w, "The script runs inline, on the flow's own goroutine (see docs/pac.md).")
		} else {
			fmt.Fprintf(w, "The script runs handed off to a runtime of its own, slower than inline: %s (see docs/pac.md).\n", why)
		}
	case rules.DimDefault:
		fmt.Fprintf(w, "No rule matched: the default (%s, priority 999) applies.\n", d.Exit)
	case rules.DimPattern:
		fmt.Fprintf(w, "Decided by %s.\n", describeRule(p.Rule(d.Rule)))
		fmt.Fprintln(w, "Patterns are tried in file order; the first that matches wins.")
	default:
		fmt.Fprintf(w, "Decided by %s.\n", describeRule(p.Rule(d.Rule)))
		fmt.Fprintln(w, "Tiers are tried in the order label, image, process, domain, cidr, port, default;")
		fmt.Fprintln(w, "the first tier with a matching rule decides, and within it the earliest rule in the file.")
	}
	var lost []string
	for _, i := range p.Matches(f) {
		if i == d.Rule {
			continue
		}
		r := p.Rule(i)
		var why string
		switch {
		case d.Dimension == rules.DimGuard:
			why = "the metadata guard comes first"
		case d.Dimension == rules.DimPattern || d.Dimension == rules.DimDefault:
			why = "an earlier pattern matched"
		case r.Priority > d.Priority:
			why = fmt.Sprintf("the %s tier is tried after %s", r.Dimension, d.Dimension)
		case r.Priority == d.Priority:
			why = fmt.Sprintf("rule %d comes first in the same tier", d.Rule)
		}
		lost = append(lost, fmt.Sprintf("  %s\n    lost: %s", describeRule(r), why))
	}
	if len(lost) > 0 {
		fmt.Fprintln(w, "\nAlso matched, but lost:")
		for _, l := range lost {
			fmt.Fprintln(w, l)
		}
	} else if d.Dimension != rules.DimScript {
		fmt.Fprintln(w, "\nNo other rule matched.")
	}
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
