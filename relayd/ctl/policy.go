package ctl

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/rules/pac"
)

// policyFlags are the ways explain and lint name a policy: a rules file, the pattern
// form from flags, or a PAC script file.
type policyFlags struct {
	rules    string
	routes   multiFlag
	def      string
	pac      string
	detached bool
	deadline time.Duration
}

func (pf *policyFlags) register(fs *flag.FlagSet, withRules bool) {
	if withRules {
		fs.StringVar(&pf.rules, "rules", "", "the rules `FILE` (as the daemon's --config)")
	}
	fs.Var(&pf.routes, "egress-route", "a pattern-form rule `PATTERN=ROUTE` (repeatable; instead of a file)")
	fs.StringVar(&pf.def, "egress-default", "", "the default `ROUTE` of --egress-route or --egress-pac (cluster when absent)")
	fs.StringVar(&pf.pac, "egress-pac", "", "a PAC script `FILE` (FindProxyForURL) as the policy (as the daemon's --egress-pac)")
	fs.BoolVar(&pf.detached, "detached", false, "the policy is for detached use (no attach session): client is refused")
	fs.DurationVar(&pf.deadline, "script-deadline", pac.DefaultDeadline, "a PAC script's time `LIMIT` per call (the daemon's default)")
}

// loadOptions are the daemon's, in this environment: gateway only with
// KL_EGRESS_GATEWAY=1 (SPEC §6); named exits are not checked without its config.
func (pf *policyFlags) options(env *Env, detached bool) rules.LoadOptions {
	return rules.LoadOptions{
		AllowGateway: env.Getenv("KL_EGRESS_GATEWAY") == "1",
		Detached:     detached,
		PAC:          pac.Options{Deadline: pf.deadline},
	}
}

// source names where the policy comes from: the rules file, the PAC script, or the
// --egress-route flags.
func (pf *policyFlags) source() string {
	switch {
	case pf.rules != "":
		return pf.rules
	case pf.pac != "":
		return pf.pac
	}
	return "--egress-route flags"
}

func (pf *policyFlags) load(env *Env, cmd string, o rules.LoadOptions) (*rules.Policy, error) {
	if pf.deadline <= 0 {
		return nil, usageError(env, cmd, "--script-deadline %v: want a positive duration", pf.deadline)
	}
	switch {
	case pf.rules != "" && (len(pf.routes) > 0 || pf.def != "" || pf.pac != ""):
		return nil, usageError(env, cmd, "--rules and --egress-route/--egress-default/--egress-pac are two ways to give a policy; use one")
	case pf.pac != "" && len(pf.routes) > 0:
		return nil, usageError(env, cmd, "--egress-pac and --egress-route are two ways to give a policy; use one")
	case pf.pac != "":
		src, err := rules.ReadFile(pf.pac, pac.MaxScriptBytes)
		if err != nil {
			return nil, policyError(env, err)
		}
		p, err := rules.FromScript(pf.pac, src, pf.def, o)
		if err != nil {
			return nil, policyError(env, err)
		}
		return p, nil
	case pf.rules != "":
		p, err := rules.Load(pf.rules, o)
		if err != nil {
			return nil, policyError(env, err)
		}
		return p, nil
	case len(pf.routes) > 0 || pf.def != "":
		p, err := rules.FromRoutes(pf.routes, pf.def, o)
		if err != nil {
			return nil, policyError(env, err)
		}
		return p, nil
	}
	return nil, usageError(env, cmd, "no policy: give a rules file, --egress-route PATTERN=ROUTE or --egress-pac FILE")
}

// policyError prints a refused policy as `CODE: message (line N)` and ends with status 2.
func policyError(env *Env, err error) error {
	var e *rules.Error
	if !errors.As(err, &e) {
		e = &rules.Error{Code: rules.CodeUnreadable, Msg: err.Error()}
	}
	fmt.Fprintln(env.Stderr, e.Error())
	return &ExitError{Code: ExitInvalid, Err: e}
}
