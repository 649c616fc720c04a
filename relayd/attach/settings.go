package attach

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kl-egress/kl/relayd/api"
)

// Settings configure the daemon's attach listener (the `attach:` section of the daemon's
// settings file, readable by root only since it holds tokens). The listener is off unless
// Listen is set.
type Settings struct {
	Listen      string       `yaml:"listen"`      // host:port; "" = no attach listener
	Cert        string       `yaml:"cert"`        // server certificate (PEM)
	Key         string       `yaml:"key"`         // its private key (PEM)
	ClientCA    string       `yaml:"clientCA"`    // CA bundle for client certificates; "" = tokens only
	Credentials []Credential `yaml:"credentials"` // who may attach, and for which workloads
}

// Credential is one person or machine allowed to hold sessions, and the workloads its
// sessions may carry: those whose id is in Workloads, and those Selector matches.
type Credential struct {
	Name        string   `yaml:"name"`
	Token       string   `yaml:"token"`       // bearer token, or
	TokenSHA256 string   `yaml:"tokenSHA256"` // its sha256 in hex (keeps the token out of the file)
	Subject     string   `yaml:"subject"`     // or a client certificate with this common name (or DNS name)
	Workloads   []string `yaml:"workloads"`
	Selector    string   `yaml:"selector"` // comma-separated key=value or key (presence), all must match
}

// Enabled reports whether an attach listener is configured.
func (s *Settings) Enabled() bool { return s != nil && s.Listen != "" }

// Validate checks the settings and reports every problem, naming the credential.
func (s *Settings) Validate() error {
	if !s.Enabled() {
		return nil
	}
	var errs []error
	if _, _, err := net.SplitHostPort(s.Listen); err != nil {
		errs = append(errs, fmt.Errorf("attach: listen %q is not host:port", s.Listen))
	}
	if s.Cert == "" || s.Key == "" {
		errs = append(errs, errors.New("attach: cert and key are required (the listener is TLS only)"))
	}
	for _, p := range []struct{ what, path string }{{"cert", s.Cert}, {"key", s.Key}, {"clientCA", s.ClientCA}} {
		if p.path != "" && !filepath.IsAbs(p.path) {
			errs = append(errs, fmt.Errorf("attach: %s %q is not an absolute path", p.what, p.path))
		}
	}
	if len(s.Credentials) == 0 {
		errs = append(errs, errors.New("attach: no credentials: nobody could attach"))
	}
	names := map[string]bool{}
	for i, c := range s.Credentials {
		where := fmt.Sprintf("attach: credentials[%d] (%s)", i, c.Name)
		if c.Name == "" {
			errs = append(errs, fmt.Errorf("attach: credentials[%d]: name is missing", i))
		} else if names[c.Name] {
			errs = append(errs, fmt.Errorf("%s: name used twice", where))
		}
		names[c.Name] = true
		n := 0
		for _, v := range []string{c.Token, c.TokenSHA256, c.Subject} {
			if v != "" {
				n++
			}
		}
		if n != 1 {
			errs = append(errs, fmt.Errorf("%s: exactly one of token, tokenSHA256 and subject is needed", where))
		}
		if c.Token != "" && len(c.Token) < 16 {
			errs = append(errs, fmt.Errorf("%s: token is shorter than 16 characters", where))
		}
		if c.TokenSHA256 != "" {
			if b, err := hex.DecodeString(c.TokenSHA256); err != nil || len(b) != sha256.Size {
				errs = append(errs, fmt.Errorf("%s: tokenSHA256 is not 64 hex digits", where))
			}
		}
		if c.Subject != "" && s.ClientCA == "" {
			errs = append(errs, fmt.Errorf("%s: subject needs clientCA", where))
		}
		if _, err := ParseSelector(c.Selector); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
		if len(c.Workloads) == 0 && c.Selector == "" {
			errs = append(errs, fmt.Errorf("%s: neither workloads nor selector: it could carry nothing", where))
		}
	}
	return errors.Join(errs...)
}

// tokenMatches compares a presented token with the credential's in constant time.
func (c *Credential) tokenMatches(tok string) bool {
	if tok == "" {
		return false
	}
	sum := sha256.Sum256([]byte(tok))
	switch {
	case c.Token != "":
		want := sha256.Sum256([]byte(c.Token))
		return subtle.ConstantTimeCompare(sum[:], want[:]) == 1
	case c.TokenSHA256 != "":
		want, err := hex.DecodeString(c.TokenSHA256)
		return err == nil && subtle.ConstantTimeCompare(sum[:], want) == 1
	}
	return false
}

// Selector is a conjunction of label requirements: key=value (exact) or key (present).
// The empty selector matches nothing: a grant must be explicit.
type Selector []labelReq

type labelReq struct {
	key, value string
	presence   bool
}

// ParseSelector parses "k=v,k2,k3=v3".
func ParseSelector(s string) (Selector, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var sel Selector
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		k, v, hasValue := strings.Cut(part, "=")
		k = strings.TrimSpace(k)
		if k == "" || strings.ContainsAny(k, " \t=!") {
			return nil, fmt.Errorf("selector %q: term %d (%q) is not key=value or key", s, i+1, part)
		}
		sel = append(sel, labelReq{key: k, value: strings.TrimSpace(v), presence: !hasValue})
	}
	sort.Slice(sel, func(i, j int) bool { return sel[i].key < sel[j].key })
	return sel, nil
}

// Matches reports whether labels satisfy every term (false for the empty selector).
func (s Selector) Matches(labels map[string]string) bool {
	if len(s) == 0 {
		return false
	}
	for _, r := range s {
		v, ok := labels[r.key]
		if !ok || (!r.presence && v != r.value) {
			return false
		}
	}
	return true
}

func (s Selector) String() string {
	parts := make([]string, len(s))
	for i, r := range s {
		if r.presence {
			parts[i] = r.key
		} else {
			parts[i] = r.key + "=" + r.value
		}
	}
	return strings.Join(parts, ",")
}

// scope is what one session may carry: the credential's grant, narrowed by what the
// attach side asked for.
type scope struct {
	ids       map[string]bool
	sel       Selector
	narrowID  map[string]bool // nil: no narrowing by id
	narrowSel Selector        // nil: no narrowing by labels
}

func newScope(c *Credential, h *Hello) (*scope, error) {
	sel, err := ParseSelector(c.Selector)
	if err != nil {
		return nil, err
	}
	sc := &scope{ids: map[string]bool{}, sel: sel}
	for _, id := range c.Workloads {
		sc.ids[id] = true
	}
	if len(h.Workloads) > 0 {
		sc.narrowID = map[string]bool{}
		for _, id := range h.Workloads {
			sc.narrowID[id] = true
		}
	}
	if h.Selector != "" {
		if sc.narrowSel, err = ParseSelector(h.Selector); err != nil {
			return nil, err
		}
	}
	return sc, nil
}

func (sc *scope) allows(w *api.Workload) bool {
	if !sc.ids[w.ID] && !sc.sel.Matches(w.Labels) {
		return false
	}
	if sc.narrowID != nil && !sc.narrowID[w.ID] {
		return false
	}
	if sc.narrowSel != nil && !sc.narrowSel.Matches(w.Labels) {
		return false
	}
	return true
}

func (sc *scope) String() string {
	var parts []string
	if len(sc.ids) > 0 {
		ids := make([]string, 0, len(sc.ids))
		for id := range sc.ids {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		parts = append(parts, "ids "+strings.Join(ids, ","))
	}
	if len(sc.sel) > 0 {
		parts = append(parts, "labels "+sc.sel.String())
	}
	s := strings.Join(parts, " or ")
	if sc.narrowID != nil || sc.narrowSel != nil {
		s += " (narrowed by the session)"
	}
	return s
}
