package runtime

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/shim/config"
	"github.com/kl-egress/kl/shim/oci"
)

// baseNoProxy is never proxied: loopback (the relay's own listeners live there) and the
// instance metadata addresses (IPv4 and AWS's IPv6 one), which kl always sends direct (SPEC §4.4). Written as
// literals because Python's urllib and older curl read NO_PROXY entries only as names or
// literal addresses, not CIDRs.
var baseNoProxy = []string{"localhost", "127.0.0.1", "::1", "169.254.169.254", "fd00:ec2::254"}

// ProxyVars returns the variables to inject for mode: upper and lower case spellings of
// HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and NO_PROXY, and NODE_USE_ENV_PROXY=1 so Node's
// built-in fetch honours them. env mode uses the operator's settings (from the config,
// else from environ, kl-runtime's own environment); proxy mode points at the relay's
// loopback listeners; transparent mode needs none.
func ProxyVars(cfg *config.Config, mode string, environ []string) []oci.Var {
	var httpP, httpsP, allP, operatorNo string
	switch mode {
	case api.ModeEnv:
		httpP = pick(cfg.Env.HTTPProxy, environ, "HTTP_PROXY")
		httpsP = pick(cfg.Env.HTTPSProxy, environ, "HTTPS_PROXY")
		allP = pick(cfg.Env.AllProxy, environ, "ALL_PROXY")
		operatorNo = pick(cfg.Env.NoProxy, environ, "NO_PROXY")
		if httpP == "" && httpsP == "" && allP == "" {
			return nil
		}
	case api.ModeProxy:
		httpP = "http://127.0.0.1:" + strconv.Itoa(int(cfg.Proxy.HTTPPort))
		httpsP = httpP
		if *cfg.Proxy.AllProxy {
			allP = "socks5h://127.0.0.1:" + strconv.Itoa(int(cfg.Proxy.SOCKSPort))
		}
	default:
		return nil
	}
	no := NoProxy(baseNoProxy, strings.Split(operatorNo, ","), cfg.NoProxy)
	var vars []oci.Var
	add := func(name, val string) {
		if val != "" {
			vars = append(vars, oci.Var{Name: name, Value: val}, oci.Var{Name: strings.ToLower(name), Value: val})
		}
	}
	add("HTTP_PROXY", httpP)
	add("HTTPS_PROXY", httpsP)
	add("ALL_PROXY", allP)
	add("NO_PROXY", no)
	vars = append(vars, oci.Var{Name: "NODE_USE_ENV_PROXY", Value: "1"})
	return vars
}

// pick returns the configured value, else the variable from environ (upper case first).
func pick(configured string, environ []string, name string) string {
	if configured != "" {
		return configured
	}
	for _, n := range []string{name, strings.ToLower(name)} {
		for _, kv := range environ {
			if k, v, ok := strings.Cut(kv, "="); ok && k == n && v != "" {
				return v
			}
		}
	}
	return ""
}

// NoProxy merges NO_PROXY entries into the one spelling curl, Go, Python and Node all
// read the same way: bare domains (no leading `.` or `*.`; each matches the domain and
// its subdomains in all four), literal addresses without brackets, and canonical CIDRs.
// Duplicates are dropped, order is kept.
func NoProxy(lists ...[]string) string {
	seen := map[string]bool{}
	var out []string
	for _, l := range lists {
		for _, e := range l {
			e = normalizeNoProxy(e)
			if e == "" || seen[e] {
				continue
			}
			seen[e] = true
			out = append(out, e)
		}
	}
	return strings.Join(out, ",")
}

func normalizeNoProxy(e string) string {
	e = strings.TrimSpace(e)
	if e == "*" {
		return e
	}
	e = strings.TrimPrefix(e, "*")
	e = strings.TrimLeft(e, ".")
	if strings.HasPrefix(e, "[") && strings.HasSuffix(e, "]") {
		e = e[1 : len(e)-1]
	}
	if p, err := netip.ParsePrefix(e); err == nil {
		return p.Masked().String()
	}
	if a, err := netip.ParseAddr(e); err == nil {
		return a.String()
	}
	return strings.ToLower(strings.TrimSuffix(e, "."))
}
