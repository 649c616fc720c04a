// Package config is kl-relayd's own settings file (/etc/kl/relayd.yaml): where the daemon
// listens and keeps state, which rules file it serves, the capture port and mark, and the
// upstreams behind the `proxy` exit and the named exits, with their credentials. Because it
// may hold credentials it is readable by root only, unlike the rules file, which is mounted
// into every container.
//
// It is not the rules file (package rules) and builds no live objects: Load reads, fills
// defaults and validates plain data; the daemon turns it into listeners and dialers.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/containerd"
	"github.com/kl-egress/kl/relayd/publish"
	"github.com/kl-egress/kl/relayd/upstream"
	"github.com/kl-egress/kl/rules"
)

// DefaultPath is where kl-relayd looks for its settings unless told otherwise.
const DefaultPath = "/etc/kl/relayd.yaml"

// Defaults for the settings that are not shared with other components (those live in
// relayd/api).
const (
	DefaultIdleTimeout    = 10 * time.Minute
	MaxLoops              = 256
	DefaultRulesPoll      = 2 * time.Second
	DefaultConnectTimeout = 10 * time.Second
	DefaultAuditMaxBytes  = 16 << 20
	DefaultAuditKeep      = 3
	DefaultAuditRing      = 256
	// MaxAuditRing bounds the records kept for status (about 100 bytes each, allocated at
	// start): status shows the recent ones; the file keeps them all.
	MaxAuditRing = 65536
)

// MinConnectTimeout is the shortest connectTimeout accepted, the daemon's or an
// upstream's: below it no dial, even to a proxy next door, has time to complete, and
// every flow would fail with a timeout that looks like an unreachable upstream.
const MinConnectTimeout = 10 * time.Millisecond

// Config is the daemon's settings. Zero values mean "the default".
type Config struct {
	Socket   string `yaml:"socket"`   // unix socket of the API (api.DefaultSocket)
	StateDir string `yaml:"stateDir"` // persisted registrations (api.DefaultStateDir)
	Rules    string `yaml:"rules"`    // the rules file (api.DefaultRulesPath)
	// PublishedRules is the directory every successfully loaded rules file is published
	// into (relayd/publish; default "rules" beside Socket: /run/kl/rules); kl-runtime
	// mounts it at /etc/kl in containers so reloads reach them. "-" disables publishing.
	PublishedRules string              `yaml:"publishedRules"`
	RulesPoll      time.Duration       `yaml:"rulesPoll"`      // how often the rules file's content is compared (change notifications come on top)
	RedirectPort   uint16              `yaml:"redirectPort"`   // transparent capture port in each pod netns
	HTTPPort       uint16              `yaml:"httpPort"`       // proxy mode: HTTP proxy on the pod's loopback
	SOCKSPort      uint16              `yaml:"socksPort"`      // proxy mode: SOCKS5 proxy on the pod's loopback
	Mark           uint32              `yaml:"mark"`           // SO_MARK of the relay's own sockets
	IdleTimeout    time.Duration       `yaml:"idleTimeout"`    // a flow with no bytes either way for this long is reset (both ends)
	ConnectTimeout time.Duration       `yaml:"connectTimeout"` // direct and gateway dials
	Proxy          *Upstream           `yaml:"proxy"`          // the upstream behind the `proxy` exit
	Exits          map[string]Upstream `yaml:"exits"`          // named exits (rules say `exit: NAME`)
	Sniff          Sniff               `yaml:"sniff"`
	Audit          Audit               `yaml:"audit"`
	Metrics        string              `yaml:"metrics"` // host:port for Prometheus metrics; "" = off
	// Docker is the Docker Engine socket the daemon asks for a registered container's
	// labels and image when the registration lacks them ("" = no enrichment).
	Docker string `yaml:"docker"`
	// Containerd is the containerd the daemon asks the same, by container id ("" socket =
	// no lookup); both may be set, Docker is asked first.
	Containerd Containerd `yaml:"containerd"`
	Debug      bool       `yaml:"debug"` // log destinations (off by default: SPEC §5)
	Detached   bool       `yaml:"detached"`
	// NoFastPath turns the kernel fast path off: every transparent flow is redirected to
	// the relay (by default flows the kernel can decide alike are decided in the pod's
	// nftables table and audited from conntrack).
	NoFastPath bool `yaml:"noFastPath"`
	// Loops is the number of event-loop threads that carry transparent flows (0: one per
	// two CPUs, at least one; -1: none, every flow on its own goroutines).
	Loops int `yaml:"loops"`

	// Gateway is not read from the file: it is the operator's KL_EGRESS_GATEWAY=1 opt-in,
	// set by the caller from the environment.
	Gateway bool `yaml:"-"`

	// Routes, RouteDefault and PAC are not read from the file either: they are kl-relayd's
	// --egress-route (repeatable), --egress-default and --egress-pac flags, a policy given
	// on the command line instead of the rules file (seed 000). With PAC, Rules is the
	// script's path (so it is watched and reloaded); with Routes there is nothing to watch.
	Routes       []string `yaml:"-"`
	RouteDefault string   `yaml:"-"`
	PAC          string   `yaml:"-"`
}

// FlagRoutes reports whether the policy is --egress-route/--egress-default flags rather
// than a file (rules file or --egress-pac script).
func (c *Config) FlagRoutes() bool {
	return c.PAC == "" && (len(c.Routes) > 0 || c.RouteDefault != "")
}

// Upstream is one proxy the relay can hand flows to.
type Upstream struct {
	URL            string        `yaml:"url"`            // http://[user:pass@]host:port (CONNECT) or socks5://[user:pass@]host:port
	ConnectTimeout time.Duration `yaml:"connectTimeout"` // default: Config.ConnectTimeout
	// Pipeline saves a round trip per connection. socks5: the greeting and CONNECT
	// request go in one write; only for servers that read ahead, such as Dante
	// (microsocks does not: every flow through it would time out). http: the bytes the
	// workload already sent go in the same write as the CONNECT request, not after the
	// answer (flows on the event loops); only for proxies that forward bytes sent ahead
	// of their answer, such as Squid.
	Pipeline bool `yaml:"pipeline"`
}

// Containerd says which containerd socket and namespaces registrations are enriched from.
type Containerd struct {
	Socket string `yaml:"socket"` // e.g. /run/containerd/containerd.sock; "" = off
	// Namespaces are asked in order (default k8s.io, the CRI plugin's, then default,
	// ctr's; Docker's containers are in moby).
	Namespaces []string `yaml:"namespaces"`
}

// Sniff bounds the hostname peek of transparent flows (done only when the rules have
// domain rules, host patterns or a script).
type Sniff struct {
	Wait      time.Duration `yaml:"wait"`      // how long to wait for a TLS ClientHello or HTTP request
	SkipPorts []uint16      `yaml:"skipPorts"` // destination ports never peeked (server-first protocols)
}

// DefaultSniffWait bounds the peek; DefaultSniffSkipPorts are server-first protocols
// (FTP, SMTP, POP3, IMAP, submission, MySQL) whose clients send nothing until the server
// speaks, so a peek would only delay them.
var (
	DefaultSniffWait      = 200 * time.Millisecond
	DefaultSniffSkipPorts = []uint16{21, 25, 110, 143, 587, 3306}
)

// Audit says where decision records go.
type Audit struct {
	Path     string `yaml:"path"`     // JSON lines file; "" keeps records only in memory
	MaxBytes int64  `yaml:"maxBytes"` // rotate beyond this size
	Keep     int    `yaml:"keep"`     // rotated files kept
	Ring     int    `yaml:"ring"`     // recent records kept for status
}

// checkListenAddr checks a host:port to listen on as net.Listen takes it: a port number
// (0: any free one, which the daemon logs) or a service name, and a host that is empty
// (every address), an IP address or a name without spaces (resolved at start).
func checkListenAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("not host:port: %w", err)
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("port %q is neither 0-65535 nor a service name", port)
	}
	if strings.ContainsAny(host, " \t/") {
		return fmt.Errorf("host %q is neither an address nor a name", host)
	}
	return nil
}

// maxSettingsBytes bounds a settings file: a few kilobytes in practice.
const maxSettingsBytes = 1 << 20

// readSettings reads the settings file: a regular file of at most maxSettingsBytes.
func readSettings(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0) // a FIFO would wait for a writer
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, st.Mode().Type())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxSettingsBytes+1))
	if err == nil && len(data) > maxSettingsBytes {
		err = fmt.Errorf("%s is over %d bytes", path, maxSettingsBytes)
	}
	return data, err
}

// Load reads the settings file at path, fills defaults and validates. A missing file at
// DefaultPath means "all defaults"; a missing file named explicitly is an error.
func Load(path string) (*Config, error) {
	if path == "" {
		path = DefaultPath
	}
	data, err := readSettings(path)
	if errors.Is(err, fs.ErrNotExist) && path == DefaultPath {
		c := &Config{}
		return c, c.Fill()
	}
	if err != nil {
		return nil, fmt.Errorf("read settings: %w", err)
	}
	c, err := Parse(path, data)
	if err != nil {
		return nil, err
	}
	if c.hasSecrets() {
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("settings %s: holds upstream credentials but its mode is %v; make it readable by root only (chmod 600)", path, fi.Mode().Perm())
		}
	}
	return c, nil
}

// DecodeOne decodes a settings file of one YAML document into v, refusing fields v does
// not have. An empty file leaves v as it is ("all defaults"). A file of more documents is
// refused: yaml decodes one, and settings after a second "---" (or after an empty first
// document) would be ignored silently.
func DecodeOne(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		where := ""
		if err == nil {
			where = fmt.Sprintf(" (the second starts at line %d)", more.Line)
		}
		return fmt.Errorf("more than one YAML document%s; put every setting in one", where)
	}
	return nil
}

// Parse decodes settings from data (name is for messages), fills defaults and validates.
func Parse(name string, data []byte) (*Config, error) {
	c := &Config{}
	if err := DecodeOne(data, c); err != nil {
		return nil, fmt.Errorf("settings %s: %w", name, err)
	}
	if err := c.Fill(); err != nil {
		return nil, fmt.Errorf("settings %s: %w", name, err)
	}
	return c, nil
}

// builtinExits are the exits whose names a named exit may not take.
var builtinExits = []string{rules.ExitDirect, "cluster", rules.ExitProxy, rules.ExitDeny, "block", rules.ExitClient, rules.ExitGateway}

// Fill sets every zero field to its default and validates the result.
func (c *Config) Fill() error {
	if c.Socket == "" {
		c.Socket = api.DefaultSocket
	}
	if c.StateDir == "" {
		c.StateDir = api.DefaultStateDir
	}
	if c.Rules == "" {
		c.Rules = api.DefaultRulesPath
	}
	if c.PublishedRules == "" {
		// "rules" beside the API socket (publish.DefaultDir for the default socket), where
		// kl-runtime looks by default: moving the socket moves both, and a test daemon
		// with its socket in a temp dir publishes there, never into the node's /run/kl.
		c.PublishedRules = filepath.Join(filepath.Dir(c.Socket), filepath.Base(publish.DefaultDir))
	}
	if c.RedirectPort == 0 {
		c.RedirectPort = api.DefaultRedirectPort
	}
	if c.HTTPPort == 0 {
		c.HTTPPort = api.DefaultHTTPPort
	}
	if c.SOCKSPort == 0 {
		c.SOCKSPort = api.DefaultSOCKSPort
	}
	if c.Mark == 0 {
		c.Mark = api.DefaultMark
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.RulesPoll == 0 {
		c.RulesPoll = DefaultRulesPoll
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.Sniff.Wait == 0 {
		c.Sniff.Wait = DefaultSniffWait
	}
	if c.Sniff.SkipPorts == nil {
		c.Sniff.SkipPorts = DefaultSniffSkipPorts
	}
	if c.Audit.MaxBytes == 0 {
		c.Audit.MaxBytes = DefaultAuditMaxBytes
	}
	if c.Audit.Keep == 0 {
		c.Audit.Keep = DefaultAuditKeep
	}
	if c.Audit.Ring == 0 {
		c.Audit.Ring = DefaultAuditRing
	}
	var errs []error
	for _, p := range []struct{ what, path string }{{"socket", c.Socket}, {"stateDir", c.StateDir}, {"rules", c.Rules}, {"publishedRules", c.PublishedRules}} {
		if !filepath.IsAbs(p.path) && !(p.what == "publishedRules" && p.path == "-") {
			errs = append(errs, fmt.Errorf("%s: %q is not an absolute path", p.what, p.path))
		}
	}
	// What would only fail when the daemon starts, checked here so `kl-relayd check`
	// says so: a unix socket path over sun_path's 108 bytes, a state directory that is a file.
	if len(c.Socket) >= 108 {
		errs = append(errs, fmt.Errorf("socket: %q is %d bytes; a unix socket path has fewer than 108", c.Socket, len(c.Socket)))
	}
	if fi, err := os.Stat(c.StateDir); err == nil && !fi.IsDir() {
		errs = append(errs, fmt.Errorf("stateDir: %s is not a directory", c.StateDir))
	}
	ports := map[uint16]string{}
	for _, p := range []struct {
		what string
		port uint16
	}{{"redirectPort", c.RedirectPort}, {"httpPort", c.HTTPPort}, {"socksPort", c.SOCKSPort}} {
		if o, dup := ports[p.port]; dup {
			errs = append(errs, fmt.Errorf("%s: port %d is also %s", p.what, p.port, o))
		}
		ports[p.port] = p.what
	}
	if c.IdleTimeout < time.Second {
		errs = append(errs, fmt.Errorf("idleTimeout: %v is shorter than 1s", c.IdleTimeout))
	}
	if c.Loops < -1 || c.Loops > MaxLoops {
		errs = append(errs, fmt.Errorf("loops: %d is not between -1 and %d", c.Loops, MaxLoops))
	}
	if c.RulesPoll < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("rulesPoll: %v is shorter than 10ms", c.RulesPoll))
	}
	if c.Sniff.Wait < 0 || c.Sniff.Wait > 5*time.Second {
		errs = append(errs, fmt.Errorf("sniff: wait %v is not between 0 and 5s", c.Sniff.Wait))
	}
	if c.ConnectTimeout < 0 {
		errs = append(errs, fmt.Errorf("connectTimeout: %v is negative", c.ConnectTimeout))
	} else if c.ConnectTimeout < MinConnectTimeout {
		errs = append(errs, fmt.Errorf("connectTimeout: %v is shorter than %v", c.ConnectTimeout, MinConnectTimeout))
	}
	if c.Proxy != nil {
		if err := c.Proxy.fill(c.ConnectTimeout); err != nil {
			errs = append(errs, fmt.Errorf("proxy: %w", err))
		}
	}
	for _, name := range c.ExitNames() {
		u := c.Exits[name]
		if err := checkExitName(name); err != nil {
			errs = append(errs, fmt.Errorf("exits: %w", err))
		}
		if err := u.fill(c.ConnectTimeout); err != nil {
			errs = append(errs, fmt.Errorf("exits: %s: %w", name, err))
		}
		c.Exits[name] = u
	}
	if c.Audit.MaxBytes < 0 || c.Audit.Keep < 0 || c.Audit.Ring < 0 {
		errs = append(errs, errors.New("audit: maxBytes, keep and ring must not be negative"))
	}
	if c.Audit.Ring > MaxAuditRing {
		errs = append(errs, fmt.Errorf("audit: ring %d is over %d (the records status shows; the audit file keeps them all)", c.Audit.Ring, MaxAuditRing))
	}
	if c.Audit.Path != "" && !filepath.IsAbs(c.Audit.Path) {
		errs = append(errs, fmt.Errorf("audit: path %q is not absolute", c.Audit.Path))
	}
	if c.Containerd.Socket != "" {
		if len(c.Containerd.Namespaces) == 0 {
			c.Containerd.Namespaces = slices.Clone(containerd.DefaultNamespaces)
		}
		if !filepath.IsAbs(c.Containerd.Socket) {
			errs = append(errs, fmt.Errorf("containerd: socket %q is not an absolute path", c.Containerd.Socket))
		}
		for _, ns := range c.Containerd.Namespaces {
			if err := containerd.CheckNamespace(ns); err != nil {
				errs = append(errs, fmt.Errorf("containerd: %w", err))
			}
		}
	} else if len(c.Containerd.Namespaces) > 0 {
		errs = append(errs, errors.New("containerd: namespaces without a socket"))
	}
	if c.Metrics != "" {
		if err := checkListenAddr(c.Metrics); err != nil {
			errs = append(errs, fmt.Errorf("metrics: %q: %w", c.Metrics, err))
		}
	}
	return errors.Join(errs...)
}

func checkExitName(name string) error {
	if name == "" {
		return errors.New("an exit has an empty name")
	}
	for _, b := range builtinExits {
		if strings.EqualFold(name, b) {
			return fmt.Errorf("%q is a built-in exit and cannot be redefined", name)
		}
	}
	if !rules.ValidExitName(name) {
		return fmt.Errorf("exit name %q: a name is lower-case letters, digits, '.', '_' and '-', starting with a letter or digit, at most 63 characters (as rules name it in exit:)", name)
	}
	return nil
}

// fill gives u the daemon's connect timeout def unless it has its own, and validates it.
// A def out of bounds is reported once, by Fill, not again for every upstream using it.
func (u *Upstream) fill(def time.Duration) error {
	switch {
	case u.ConnectTimeout < 0:
		return fmt.Errorf("connectTimeout %v is negative", u.ConnectTimeout)
	case u.ConnectTimeout == 0:
		u.ConnectTimeout = def
	case u.ConnectTimeout < MinConnectTimeout:
		return fmt.Errorf("connectTimeout %v is shorter than %v", u.ConnectTimeout, MinConnectTimeout)
	}
	if u.URL == "" {
		return errors.New("url is missing")
	}
	// No message quotes the url beyond scheme://host:port, and that only once
	// upstream.ParseURL has found the authority whole.
	p, err := upstream.ParseURL(u.URL)
	if err != nil {
		return err
	}
	switch p.Scheme {
	case "http", "socks5":
	default:
		return fmt.Errorf("url scheme %q is not http or socks5", p.Scheme)
	}
	if p.Hostname() == "" || p.Port() == "" {
		return fmt.Errorf("url %s needs a host and a port", Redact(u.URL))
	}
	return nil
}

// ExitNames returns the named exits, sorted.
func (c *Config) ExitNames() []string {
	names := make([]string, 0, len(c.Exits))
	for n := range c.Exits {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// HasExit reports whether a rules file may name exit: the built-ins, and the named exits
// defined here. It is the rules.LoadOptions.Exits hook.
func (c *Config) HasExit(name string) bool {
	_, ok := c.Exits[name]
	return ok
}

func (c *Config) hasSecrets() bool {
	ups := []Upstream{}
	if c.Proxy != nil {
		ups = append(ups, *c.Proxy)
	}
	for _, u := range c.Exits {
		ups = append(ups, u)
	}
	for _, u := range ups {
		if p, err := url.Parse(u.URL); err == nil && p.User != nil {
			return true
		}
	}
	return false
}

// Redact returns an upstream url as scheme://host:port, without its user name and
// password, for messages and logs. A url with more than that (a path, query or fragment,
// which is where a password with an unencoded '/', '?' or '#' ends up) is not shown at
// all: its "host:port" may be the user name and the start of the password.
func Redact(rawURL string) string {
	if _, err := url.Parse(rawURL); err != nil {
		return "(unparsable url)"
	}
	p, err := upstream.ParseURL(rawURL)
	if err != nil {
		return "(malformed url)"
	}
	return p.Scheme + "://" + p.Host
}
