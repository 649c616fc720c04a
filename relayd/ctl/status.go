package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kl-egress/kl/relayd/api"
)

func init() {
	Register(Command{Name: "status", Summary: "show the daemon's rules, hit counts, workloads and recent decisions (fails when it is down)", Run: status})
}

// now is the clock status measures ages with (tests pin it).
var now = time.Now

// statusTimeout bounds each call to the daemon: the DaemonSet's probes give kl-ctl 5s.
const statusTimeout = 4 * time.Second

func status(ctx context.Context, env *Env, args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	socket := fs.String("socket", api.DefaultSocket, "the daemon's API `PATH` (unix socket)")
	asJSON := fs.Bool("json", false, "print the daemon's status object (GET /v1/status) as JSON")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: kl-ctl status [--json] [--socket PATH]\n\nExits 1 when the daemon cannot be reached or is not ready yet.")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(env, fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError(env, "status", "unexpected argument %q", pos[0])
	}
	c := api.NewClient(*socket, statusTimeout)
	var st api.Status
	if err := c.Call(ctx, "GET", "/v1/status", nil, &st); err != nil {
		return statusFailed(env, err)
	}
	if *asJSON {
		b, err := json.MarshalIndent(st, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "%s\n", b)
	} else {
		regs, err := c.List(ctx)
		if err != nil {
			return statusFailed(env, err)
		}
		printStatus(env.Stdout, *socket, st, regs, now())
	}
	if !st.Ready {
		err := errors.New("kl-relayd is not ready (restoring registrations)")
		fmt.Fprintf(env.Stderr, "kl-ctl status: %v\n", err)
		return &ExitError{Code: ExitFail, Err: err}
	}
	return nil
}

// statusFailed says why the daemon could not answer; the exit status is what probes see.
func statusFailed(env *Env, err error) error {
	if errors.Is(err, api.ErrUnreachable) {
		err = fmt.Errorf("%w (is kl-relayd running? --socket names another socket)", err)
	}
	fmt.Fprintf(env.Stderr, "kl-ctl status: %v\n", err)
	return &ExitError{Code: ExitFail, Err: err}
}

func printStatus(w io.Writer, socket string, st api.Status, regs []api.Registration, t time.Time) {
	ready := "ready"
	if !st.Ready {
		ready = "NOT READY (restoring registrations)"
	}
	fmt.Fprintf(w, "kl-relayd at %s: %s, up %s (since %s)\n", socket, ready, age(t, st.StartedAt), stamp(st.StartedAt))
	fmt.Fprintf(w, "  fds %d of %d, goroutines %d\n", st.FDs, st.FDLimit, st.Goroutines)

	r := st.Rules
	fmt.Fprintln(w, "\nrules")
	fmt.Fprintf(w, "  path     %s\n", r.Path)
	fmt.Fprintf(w, "  sha256   %s\n", orNone(r.Hash))
	if r.LoadedAt.IsZero() {
		fmt.Fprintln(w, "  loaded   never")
	} else {
		fmt.Fprintf(w, "  loaded   %s (%s ago)\n", stamp(r.LoadedAt), age(t, r.LoadedAt))
	}
	if r.LastError != "" {
		code := r.LastErrorCode
		if code == "" {
			code = "no reason code"
		}
		fmt.Fprintf(w, "  REFUSED  %s (%s ago): %s: %s\n", stamp(r.LastErrorAt), age(t, r.LastErrorAt), code, r.LastError)
		fmt.Fprintln(w, "           the rules above stay live until the file loads")
	} else {
		fmt.Fprintln(w, "  last load error: none")
	}

	fl := st.Flows
	fmt.Fprintf(w, "\nflows: %d active, %d since start", fl.Active, fl.Total)
	if len(fl.ByExit) > 0 {
		exits := make([]string, 0, len(fl.ByExit))
		for e := range fl.ByExit {
			exits = append(exits, e)
		}
		sort.Strings(exits)
		parts := make([]string, len(exits))
		for i, e := range exits {
			parts[i] = fmt.Sprintf("%s %d", e, fl.ByExit[e])
		}
		fmt.Fprintf(w, " (%s)", strings.Join(parts, ", "))
	}
	fmt.Fprintln(w)

	fmt.Fprintf(w, "\nworkloads: %d registered\n", st.Workloads)
	if len(regs) > 0 {
		sort.Slice(regs, func(i, j int) bool { return regs[i].Workload.ID < regs[j].Workload.ID })
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  ID\tPOD\tMODE\tSOURCE\tLISTENERS\tNETNS\tSINCE")
		for _, g := range regs {
			wl := g.Workload
			pod := "-"
			if wl.Name != "" {
				pod = wl.Name
				if wl.Namespace != "" {
					pod = wl.Namespace + "/" + wl.Name
				}
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", shortID(wl.ID), pod, wl.Mode, wl.Source, listeners(g.Listeners), wl.Netns, stamp(g.Since))
		}
		tw.Flush()
	}

	printKernel(w, st)
	printAttach(w, st)
	printAudit(w, st.Audit)

	since := ""
	if !st.HitsSince.IsZero() {
		since = " since the rules loaded at " + st.HitsSince.UTC().Format(time.RFC3339)
	}
	fmt.Fprintln(w, "\nhits per rule"+since+" (rule 0: the default, the guard or a script)")
	if len(st.Hits) == 0 {
		fmt.Fprintln(w, "  none yet")
	} else {
		hits := append([]api.RuleHit(nil), st.Hits...)
		sort.SliceStable(hits, func(i, j int) bool {
			if hits[i].Rule != hits[j].Rule {
				return hits[i].Rule < hits[j].Rule
			}
			return hits[i].Dimension < hits[j].Dimension
		})
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  RULE\tDIMENSION\tHITS")
		for _, h := range hits {
			fmt.Fprintf(tw, "  %d\t%s\t%d\n", h.Rule, h.Dimension, h.Count)
		}
		tw.Flush()
	}

	fmt.Fprintf(w, "\nrecent decisions (%d, oldest first)\n", len(st.Recent))
	if len(st.Recent) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  RULE\tDIMENSION\tACTION\tAT\tPATH\tNOTE")
		for _, d := range st.Recent {
			rule := fmt.Sprint(d.Rule)
			if d.Priority != 0 {
				rule = fmt.Sprintf("%d (priority %d)", d.Rule, d.Priority)
			}
			note := d.Note
			if d.Reason != "" {
				note = strings.TrimSpace(note + " [" + d.Reason + "]")
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", rule, d.Dimension, d.Exit, d.At.UTC().Format("2006-01-02T15:04:05.000Z07:00"), orDash(d.Path), orDash(note))
		}
		tw.Flush()
	}
}

// printKernel shows, per transparent workload, how much of its policy the kernel fast
// path decides (flows it matches never reach the relay and are audited from conntrack).
func printKernel(w io.Writer, st api.Status) {
	if !st.FastPath {
		return // fast path off, or a daemon that predates it
	}
	fmt.Fprintf(w, "\nkernel fast path: %s (the share of each policy decided in the pod's nftables table)\n", plural(len(st.Kernel), "transparent workload"))
	if len(st.Kernel) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, k := range st.Kernel {
		line := fmt.Sprintf("kernel: %.0f%% of policy, %s", 100*k.Share, plural(int(k.Flows), "flow"))
		if k.AllKernel {
			line += " (every flow: no redirect)"
		}
		if k.Late > 0 {
			line += fmt.Sprintf(", %d late records (%d event overruns)", k.Late, k.Overruns)
		}
		if k.Lost > 0 {
			line += fmt.Sprintf(", %d lost events", k.Lost)
		}
		if k.Unknown > 0 {
			line += fmt.Sprintf(", %d not recorded (marked by a table of a previous kl-relayd)", k.Unknown)
		}
		if k.Error != "" {
			line += "; last install FAILED: " + k.Error
		}
		fmt.Fprintf(tw, "  %s\t%s\n", shortID(k.ID), line)
	}
	tw.Flush()
}

// printAttach lists the live attach sessions, which carry the workloads' `client` flows.
func printAttach(w io.Writer, st api.Status) {
	if len(st.Attach) == 0 {
		return
	}
	fmt.Fprintf(w, "\nattach sessions: %d live (the client exit)\n", len(st.Attach))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  ID\tCREDENTIAL\tREMOTE\tSCOPE\tSINCE\tFLOWS\tREFUSED")
	for _, a := range st.Attach {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%d\t%d\n", shortID(a.ID), a.Credential, a.Remote, orDash(a.Scope),
			a.Since.UTC().Format(time.RFC3339), a.Flows, a.Refused)
	}
	tw.Flush()
}

// printAudit says whether the audit file gets every record: how many it missed and the
// write failure going on.
func printAudit(w io.Writer, a *api.AuditStatus) {
	if a == nil {
		return // a daemon that predates it
	}
	if a.Path == "" {
		fmt.Fprintln(w, "\naudit file: none (records are kept in memory only)")
		return
	}
	records := "records"
	if a.Dropped == 1 {
		records = "record"
	}
	fmt.Fprintf(w, "\naudit file: %s, %d %s not written since start\n", a.Path, a.Dropped, records)
	if a.Error != "" {
		fmt.Fprintf(w, "  writing FAILS: %s\n", a.Error)
	}
}

func listeners(l api.Listeners) string {
	s := fmt.Sprintf("redirect %d", l.Redirect)
	if l.HTTP != 0 {
		s += fmt.Sprintf(", http %d", l.HTTP)
	}
	if l.SOCKS != 0 {
		s += fmt.Sprintf(", socks %d", l.SOCKS)
	}
	return s
}

// shortID keeps container ids (64 hex digits) readable, as docker ps does.
func shortID(id string) string {
	if len(id) > 16 {
		return id[:12] + "…"
	}
	return id
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}

// age is how long ago t was, rounded for people.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	default:
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
