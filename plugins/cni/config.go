package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api/wire"
)

// Config is kl-cni's entry in a conflist. Every field is optional.
//
//	{"type": "kl-cni", "socket": "/run/kl/relayd.sock", "mode": "transparent",
//	 "redirectPort": 15001, "mark": 19276, "excludeCIDRs": ["10.96.0.0/12"],
//	 "excludePorts": [53], "ipv6": true, "rejectQUIC": true, "timeout": "5s",
//	 "capabilities": {"io.kubernetes.cri.pod-annotations": true}}
type Config struct {
	types.PluginConf
	Socket       string   `json:"socket,omitempty"`       // kl-relayd's API socket (wire.DefaultSocket)
	Mode         string   `json:"mode,omitempty"`         // the node's default mode (transparent)
	RedirectPort uint16   `json:"redirectPort,omitempty"` // must match the daemon's (wire.DefaultRedirectPort)
	Mark         uint32   `json:"mark,omitempty"`         // must match the daemon's (wire.DefaultMark)
	ExcludeCIDRs []string `json:"excludeCIDRs,omitempty"` // destinations never captured
	ExcludePorts []uint16 `json:"excludePorts,omitempty"` // destination ports never captured
	IPv6         *bool    `json:"ipv6,omitempty"`         // capture IPv6 TCP (default true; false rejects it)
	RejectQUIC   *bool    `json:"rejectQUIC,omitempty"`   // reject UDP/443 in transparent mode (default true)
	Timeout      string   `json:"timeout,omitempty"`      // bound on each call to the daemon (default 5s)
	Debug        bool     `json:"debug,omitempty"`        // log to stderr at debug level

	RuntimeConfig RuntimeConfig `json:"runtimeConfig,omitempty"`

	// Filled by parseConfig.
	timeout  time.Duration
	excludes []netip.Prefix
	dropped  error // decodeLenient: the fields that did not decode
}

// RuntimeConfig is what the runtime passes for the capabilities the conflist declares.
// containerd passes pod annotations as "io.kubernetes.cri.pod-annotations"; the generic
// podAnnotations/podLabels keys are for runtimes and wrappers that pass them.
type RuntimeConfig struct {
	CRIAnnotations map[string]string `json:"io.kubernetes.cri.pod-annotations,omitempty"`
	Annotations    map[string]string `json:"podAnnotations,omitempty"`
	Labels         map[string]string `json:"podLabels,omitempty"`
}

// DefaultTimeout bounds each call to kl-relayd.
const DefaultTimeout = 5 * time.Second

// parseConfig decodes stdin, fills defaults, validates and parses prevResult.
func parseConfig(stdin []byte) (*Config, error) {
	c, err := decodeConfig(stdin)
	if err != nil {
		return nil, err
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("kl-cni config: %w", err)
	}
	if err := version.ParsePrevResult(&c.PluginConf); err != nil {
		return nil, fmt.Errorf("kl-cni config: %w", err)
	}
	return c, nil
}

// decodeConfig decodes stdin and fills the defaults, without validating: what DEL
// needs (the socket, the timeout) is there even in a config ADD would refuse, as long
// as every field has its JSON type (decodeLenient copes with the rest).
func decodeConfig(stdin []byte) (*Config, error) {
	c := &Config{}
	if err := json.Unmarshal(stdin, c); err != nil {
		return nil, fmt.Errorf("parse kl-cni config: %w", err)
	}
	if c.Socket == "" {
		c.Socket = wire.DefaultSocket
	}
	if c.Mode == "" {
		c.Mode = wire.ModeTransparent
	}
	if c.RedirectPort == 0 {
		c.RedirectPort = wire.DefaultRedirectPort
	}
	if c.Mark == 0 {
		c.Mark = wire.DefaultMark
	}
	c.timeout = DefaultTimeout
	if d, err := time.ParseDuration(c.Timeout); err == nil && d > 0 {
		c.timeout = d
	}
	return c, nil
}

// decodeLenient is decodeConfig for DEL, which must release the sandbox whatever the
// config holds: libcni stops a DEL at the first plugin that fails, so the main plugin
// would never free the pod's address. A field of the wrong JSON type ("timeout": 5,
// "ipv6": "false", a port above 65535) keeps its default, and c.dropped says which;
// only stdin that is not a JSON object is an error.
func decodeLenient(stdin []byte) (*Config, error) {
	c, err := decodeConfig(stdin)
	if err == nil {
		return c, nil
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(stdin, &fields) != nil {
		return nil, err
	}
	var dropped []error
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		one, _ := json.Marshal(map[string]json.RawMessage{k: fields[k]})
		if ferr := json.Unmarshal(one, &Config{}); ferr != nil {
			delete(fields, k)
			dropped = append(dropped, ferr)
		}
	}
	rest, _ := json.Marshal(fields)
	if c, err = decodeConfig(rest); err != nil {
		return nil, err
	}
	c.dropped = errors.Join(dropped...)
	return c, nil
}

// validate checks the fields decodeConfig filled in and parses the exclusions.
func (c *Config) validate() error {
	var errs []error
	if c.Timeout != "" {
		if d, err := time.ParseDuration(c.Timeout); err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("timeout %q: want a positive duration like \"5s\"", c.Timeout))
		}
	}
	if err := checkMode(c.Mode); err != nil {
		errs = append(errs, fmt.Errorf("mode: %w", err))
	}
	c.excludes = nil
	for i, s := range c.ExcludeCIDRs {
		p, err := parsePrefix(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("excludeCIDRs[%d]: %w", i, err))
			continue
		}
		c.excludes = append(c.excludes, p)
	}
	if err := c.capture().Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// parsePrefix accepts a prefix or a bare address (a host prefix).
func parsePrefix(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR or an address", s)
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", s)
	}
	return p, nil
}

func checkMode(m string) error {
	switch m {
	case wire.ModeEnv, wire.ModeProxy, wire.ModeTransparent:
		return nil
	}
	return fmt.Errorf("%q is not env, proxy or transparent", m)
}

// capture is the nftables program this config installs.
func (c *Config) capture() netns.Capture {
	return netns.Capture{
		RedirectPort: c.RedirectPort,
		Mark:         c.Mark,
		IPv6:         c.IPv6 == nil || *c.IPv6,
		RejectQUIC:   c.RejectQUIC == nil || *c.RejectQUIC,
		ExcludeCIDRs: c.excludes,
		ExcludePorts: c.ExcludePorts,
	}
}

// wireCapture is capture() as the registration carries it to the relay.
func (c *Config) wireCapture() *wire.Capture {
	n := c.capture()
	return &wire.Capture{
		RedirectPort: n.RedirectPort,
		Mark:         n.Mark,
		IPv6:         n.IPv6,
		RejectQUIC:   n.RejectQUIC,
		ExcludeCIDRs: n.ExcludeCIDRs,
		ExcludePorts: n.ExcludePorts,
	}
}

// annotations merges what the runtime passed; the CRI key wins.
func (c *Config) annotations() map[string]string {
	if len(c.RuntimeConfig.Annotations) == 0 && len(c.RuntimeConfig.CRIAnnotations) == 0 {
		return nil
	}
	m := map[string]string{}
	for k, v := range c.RuntimeConfig.Annotations {
		m[k] = v
	}
	for k, v := range c.RuntimeConfig.CRIAnnotations {
		m[k] = v
	}
	return m
}

// podMode is the pod's egress mode: its kl.egress.mode annotation, else its label, else
// the node default.
func (c *Config) podMode() (string, error) {
	for _, src := range []struct {
		what string
		m    map[string]string
	}{{"annotation", c.annotations()}, {"label", c.RuntimeConfig.Labels}} {
		if v, ok := src.m[wire.LabelMode]; ok {
			if err := checkMode(v); err != nil {
				return "", fmt.Errorf("pod %s %s: %w", src.what, wire.LabelMode, err)
			}
			return v, nil
		}
	}
	return c.Mode, nil
}

// podArgs are the Kubernetes identity keys of CNI_ARGS.
type podArgs struct {
	Namespace, Name, InfraID string
}

// parseArgs reads CNI_ARGS (K=V;K=V), leniently: unknown keys are ignored.
func parseArgs(s string) podArgs {
	var a podArgs
	for _, kv := range strings.Split(s, ";") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		switch k {
		case "K8S_POD_NAMESPACE":
			a.Namespace = v
		case "K8S_POD_NAME":
			a.Name = v
		case "K8S_POD_INFRA_CONTAINER_ID":
			a.InfraID = v
		}
	}
	return a
}
