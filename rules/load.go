package rules

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"gopkg.in/yaml.v3"

	"github.com/kl-egress/kl/rules/pac"
)

// MaxFileBytes bounds a rules file. A 100 000-rule file is about 5 MB.
const MaxFileBytes = 16 << 20

// LoadOptions say how a policy will be used; they change what loads.
type LoadOptions struct {
	Exits        func(name string) bool // nil: accept any named exit (kl-ctl without daemon config)
	AllowGateway bool                   // KL_EGRESS_GATEWAY=1
	Detached     bool                   // policy for detached use: `client` refused (E_CLIENT_DETACHED)
	PAC          pac.Options            // deadline, time zone for scripts
}

// Load reads and compiles a rules file. Errors are *Error.
func Load(path string, o LoadOptions) (*Policy, error) {
	data, err := ReadFile(path, MaxFileBytes)
	if err != nil {
		return nil, err
	}
	return Parse(path, data, o)
}

// ReadFile reads a policy file (rules, a PAC script) of at most limit bytes, read no
// further than the bound, so that a huge file (or /dev/zero) cannot exhaust whoever
// reads it: a daemon watching the file keeps its rules. A regular file over the bound is
// refused without being read; a pipe (kl-ctl lint /dev/stdin) is read up to it. Errors
// are *Error: E_UNREADABLE, or E_TOO_LARGE naming the bound.
func ReadFile(path string, limit int64) ([]byte, error) {
	// Non-blocking open: a FIFO nobody writes to yet reads as empty instead of holding
	// the caller (Go's poller still waits for a writer's data once there is one).
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, &Error{Code: CodeUnreadable, Msg: fmt.Sprintf("read %s: %v", path, unwrapPath(err))}
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return nil, &Error{Code: CodeUnreadable, Msg: fmt.Sprintf("read %s: %v", path, unwrapPath(err))}
	} else if st.IsDir() {
		return nil, &Error{Code: CodeUnreadable, Msg: fmt.Sprintf("read %s: a directory, not a file", path)}
	} else if st.Mode().IsRegular() && st.Size() > limit {
		return nil, &Error{Code: CodeTooLarge, Msg: fmt.Sprintf("%s is %d bytes, over %d", path, st.Size(), limit)}
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, &Error{Code: CodeUnreadable, Msg: fmt.Sprintf("read %s: %v", path, unwrapPath(err))}
	}
	if int64(len(data)) > limit { // it grew while read
		return nil, &Error{Code: CodeTooLarge, Msg: fmt.Sprintf("%s is over %d bytes", path, limit)}
	}
	return data, nil
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Parse compiles a rules file held in memory; name is used in messages.
func Parse(name string, data []byte, o LoadOptions) (*Policy, error) {
	if len(data) > MaxFileBytes {
		return nil, &Error{Code: CodeTooLarge, Msg: fmt.Sprintf("%s is over %d bytes", name, MaxFileBytes)}
	}
	p, err := parse(name, data, o)
	if err != nil {
		return nil, err
	}
	p.src = data
	sum := sha256.Sum256(data)
	p.hash = hex.EncodeToString(sum[:])
	if err := p.compile(); err != nil {
		return nil, err
	}
	return p, nil
}

// FromRoutes builds a pattern-form policy from `--egress-route PATTERN=ROUTE` flags and
// `--egress-default ROUTE` ("" = cluster). Its Source is the equivalent rules file, so
// another hop can load the same policy with Parse.
func FromRoutes(routes []string, def string, o LoadOptions) (*Policy, error) {
	var b bytes.Buffer
	if def != "" {
		b.WriteString("default: " + yamlString(def) + "\n")
	}
	b.WriteString("rules:\n")
	for i, r := range routes {
		pat, route, ok := cutLast(r, "=")
		if !ok {
			return nil, &Error{Code: CodeBadPattern, Rule: i + 1, Msg: fmt.Sprintf("--egress-route %q: want PATTERN=ROUTE", r)}
		}
		if _, err := parsePattern(pat); err != nil {
			e := err.(*Error)
			e.Rule = i + 1
			return nil, e
		}
		if _, err := parseExit(route, o, CodeBadAction, "route"); err != nil {
			err.Rule = i + 1
			return nil, err
		}
		fmt.Fprintf(&b, "  - pattern: %s\n    route: %s\n", yamlString(pat), yamlString(route))
	}
	if def != "" {
		if _, err := parseExit(def, o, CodeBadAction, "--egress-default"); err != nil {
			return nil, err
		}
	}
	p, err := Parse("--egress-route", b.Bytes(), o)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.Line = 0 // lines of the generated file mean nothing to the user
		}
		return nil, err
	}
	p.pattern = true
	for i := range p.rules {
		p.rules[i].line = 0 // flags have no lines
	}
	return p, nil
}

func cutLast(s, sep string) (before, after string, ok bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// yamlString quotes s for YAML (a JSON string is a valid YAML double-quoted scalar).
func yamlString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

// parse loads a file. A large rules list is parsed in chunks of items, so the YAML
// node tree of the whole file never exists at once; any file the chunked reading
// cannot handle exactly, and any error, goes through one whole-document parse, which
// alone defines the result.
func parse(name string, data []byte, o LoadOptions) (*Policy, error) {
	if len(data) >= chunkMinBytes {
		if p, ok := parseChunked(name, data, o); ok {
			return p, nil
		}
	}
	return parseDoc(name, data, o)
}

func parseDoc(name string, data []byte, o LoadOptions) (*Policy, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			return nil, &Error{Code: CodeSyntax, Msg: name + " is empty (write at least `default: direct`)"}
		}
		return nil, syntaxError(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		if err != nil {
			return nil, syntaxError(err)
		}
		return nil, &Error{Code: CodeSyntax, Line: extra.Line, Msg: "more than one YAML document"}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil, &Error{Code: CodeSyntax, Msg: name + " is empty (write at least `default: direct`)"}
		}
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
			return nil, &Error{Code: CodeSyntax, Line: root.Line, Msg: name + " is empty (write at least `default: direct`)"}
		}
		return nil, &Error{Code: CodeBadValue, Line: root.Line, Msg: "the top level must be a mapping with default, rules, mode or script"}
	}
	p := &Policy{name: name, opts: o, def: ExitDirect}
	var rulesNode, scriptNode *yaml.Node
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if err := noAlias(k, v); err != nil {
			return nil, err
		}
		if l, dup := seen[k.Value]; dup {
			return nil, &Error{Code: CodeSyntax, Line: k.Line, Msg: fmt.Sprintf("key %q repeated (first at line %d)", k.Value, l)}
		}
		seen[k.Value] = k.Line
		switch k.Value {
		case "default":
			s, err := scalar(v, "default")
			if err != nil {
				return nil, err
			}
			exit, perr := parseExit(s, o, CodeBadAction, "default")
			if perr != nil {
				perr.Line = v.Line
				return nil, perr
			}
			p.def = exit
		case "mode":
			s, err := scalar(v, "mode")
			if err != nil {
				return nil, err
			}
			switch s {
			case "env", "proxy", "transparent":
				p.mode = s
			default:
				return nil, &Error{Code: CodeBadMode, Line: v.Line, Msg: fmt.Sprintf("mode %q: want env, proxy or transparent", s)}
			}
		case "rules":
			rulesNode = v
		case "script":
			scriptNode = v
		case "gateway":
			return nil, &Error{Code: CodeGatewayOff, Line: k.Line, Msg: "a separate gateway URL is not supported: the relay daemon itself is the gateway (action: gateway, with KL_EGRESS_GATEWAY=1)"}
		default:
			return nil, &Error{Code: CodeUnknownKey, Line: k.Line, Msg: fmt.Sprintf("unknown top-level key %q (want default, rules, mode or script)", k.Value)}
		}
	}
	if rulesNode != nil {
		if err := p.parseRules(rulesNode, o); err != nil {
			return nil, err
		}
	}
	if scriptNode != nil {
		if err := p.parseScript(scriptNode, o); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func syntaxError(err error) *Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	e := &Error{Code: CodeSyntax, Msg: msg}
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		e.Msg = strings.TrimPrefix(strings.Replace(msg, m[0]+": ", "", 1), "unmarshal errors:\n  ")
	}
	return e
}

func noAlias(nodes ...*yaml.Node) error {
	for _, n := range nodes {
		if n.Kind == yaml.AliasNode || n.Anchor != "" {
			return &Error{Code: CodeSyntax, Line: n.Line, Msg: "YAML anchors and aliases are not supported in rules files"}
		}
	}
	return nil
}

// scalar returns a node's text, refusing sequences and mappings.
func scalar(n *yaml.Node, what string) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", &Error{Code: CodeBadValue, Line: n.Line, Msg: fmt.Sprintf("%s must be a single value, not a %s", what, kindName(n))}
	}
	if n.Tag == "!!null" {
		return "", nil
	}
	return n.Value, nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "list"
	case yaml.MappingNode:
		return "mapping"
	case yaml.AliasNode:
		return "alias"
	}
	return "document"
}

// parseExit turns an action, route or default into a canonical exit.
func parseExit(s string, o LoadOptions, code Code, what string) (string, *Error) {
	switch s {
	case "direct", "cluster":
		return ExitDirect, nil
	case "proxy":
		return ExitProxy, nil
	case "deny", "block":
		return ExitDeny, nil
	case "client":
		if o.Detached {
			return "", &Error{Code: CodeClientDetached, Msg: what + ": client needs a live kl-ctl attach session, and this policy is for detached use (route to direct, proxy, gateway or deny)"}
		}
		return ExitClient, nil
	case "gateway":
		if !o.AllowGateway {
			return "", &Error{Code: CodeGatewayOff, Msg: what + ": the gateway exit is off on this node (the operator enables it with KL_EGRESS_GATEWAY=1)"}
		}
		return ExitGateway, nil
	}
	if strings.Contains(s, "://") || strings.HasPrefix(s, "gateway:") {
		return "", &Error{Code: CodeGatewayOff, Msg: fmt.Sprintf("%s %q: a separate gateway URL is not supported (use gateway, served by the relay daemon itself)", what, s)}
	}
	return "", &Error{Code: code, Msg: fmt.Sprintf("%s %q: want direct (cluster), proxy, deny (block), client or gateway; a named exit goes in exit:", what, s)}
}

var exitName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidExitName says whether name can name an exit in a rule (exit:): lower-case letters,
// digits, '.', '_' and '-', starting with a letter or digit, at most 63 characters. The
// daemon's configuration takes no other names, so every exit it defines can be named.
func ValidExitName(name string) bool { return exitName.MatchString(name) }

func isReservedExit(s string) bool {
	switch s {
	case "direct", "cluster", "proxy", "deny", "block", "client", "gateway":
		return true
	}
	return false
}

var dimFields = map[string]Dimension{
	"label": DimLabel, "image": DimImage, "process": DimProcess,
	"domain": DimDomain, "cidr": DimCIDR, "port": DimPort, "pattern": DimPattern,
}

func mappingHas(n *yaml.Node, key string) bool {
	for j := 0; j < len(n.Content); j += 2 {
		if n.Content[j].Value == key {
			return true
		}
	}
	return false
}

func (p *Policy) parseRules(n *yaml.Node, o LoadOptions) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return &Error{Code: CodeBadValue, Line: n.Line, Msg: "rules must be a list"}
	}
	for _, item := range n.Content {
		if err := p.addRule(item, o); err != nil {
			return err
		}
	}
	return nil
}

// addRule parses the next rule and appends it.
func (p *Policy) addRule(item *yaml.Node, o LoadOptions) error {
	idx := len(p.rules) + 1
	r, err := parseRule(idx, item, o)
	if err != nil {
		return err
	}
	isPattern := r.dim == DimPattern
	if idx == 1 {
		p.pattern = isPattern
	} else if isPattern != p.pattern {
		first, this := "dimension", "pattern"
		if p.pattern {
			first, this = this, first
		}
		return &Error{Code: CodeMixedForms, Rule: idx, Line: r.line, Msg: fmt.Sprintf("a %s rule in a file whose rule 1 is a %s rule; one file uses one form", this, first)}
	}
	p.rules = append(p.rules, r)
	return nil
}

func parseRule(idx int, n *yaml.Node, o LoadOptions) (rule, error) {
	r := rule{idx: idx, line: n.Line}
	fail := func(code Code, line int, format string, a ...any) (rule, error) {
		return rule{}, &Error{Code: code, Rule: idx, Line: line, Msg: fmt.Sprintf(format, a...)}
	}
	if err := noAlias(n); err != nil {
		err.(*Error).Rule = idx
		return rule{}, err
	}
	if n.Kind != yaml.MappingNode {
		return fail(CodeBadValue, n.Line, "a rule must be a mapping such as {domain: \"*.example.com\", action: proxy}, not a %s", kindName(n))
	}
	var (
		matchKey, matchVal                        string
		matchLine, actionLine, exitLine, nmatches int
		action, exitName_                         string
		hasAction, hasExit                        bool
	)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if err := noAlias(k, v); err != nil {
			err.(*Error).Rule = idx
			return rule{}, err
		}
		for j := 0; j < i; j += 2 {
			if n.Content[j].Value == k.Value {
				return fail(CodeSyntax, k.Line, "key %q repeated (first at line %d)", k.Value, n.Content[j].Line)
			}
		}
		if _, ok := dimFields[k.Value]; ok {
			nmatches++
			if nmatches > 1 {
				return fail(CodeMultiMatch, k.Line, "both %s and %s: a rule has exactly one match field (write two rules)", matchKey, k.Value)
			}
			s, err := scalar(v, k.Value)
			if err != nil {
				err.(*Error).Rule = idx
				return rule{}, err
			}
			matchKey, matchVal, matchLine = k.Value, s, k.Line
			continue
		}
		switch k.Value {
		case "action", "route":
			if hasAction {
				return fail(CodeMultiMatch, k.Line, "both action and route")
			}
			s, err := scalar(v, k.Value)
			if err != nil {
				err.(*Error).Rule = idx
				return rule{}, err
			}
			action, actionLine, hasAction = s, k.Line, true
		case "exit":
			s, err := scalar(v, "exit")
			if err != nil {
				err.(*Error).Rule = idx
				return rule{}, err
			}
			exitName_, exitLine, hasExit = s, k.Line, true
		case "note":
			s, err := scalar(v, "note")
			if err != nil {
				err.(*Error).Rule = idx
				return rule{}, err
			}
			r.note = s
		case "gateway":
			return fail(CodeGatewayOff, k.Line, "a separate gateway URL is not supported: the relay daemon itself is the gateway (action: gateway, with KL_EGRESS_GATEWAY=1)")
		default:
			return fail(CodeUnknownKey, k.Line, "unknown key %q (a rule has one of label, image, process, domain, cidr, port or pattern, plus action/route, exit, note)", k.Value)
		}
	}
	if nmatches == 0 {
		return fail(CodeNoMatch, n.Line, "no match field (want one of label, image, process, domain, cidr, port, pattern)")
	}
	r.dim = dimFields[matchKey]
	r.value = matchVal
	// action belongs to the dimension form, route to the pattern form.
	want := "action"
	if r.dim == DimPattern {
		want = "route"
	}
	if !mappingHas(n, want) && hasAction {
		other := "route"
		if want == "route" {
			other = "action"
		}
		return fail(CodeUnknownKey, actionLine, "%s rules take %s, not %s", map[bool]string{true: "pattern", false: "dimension"}[r.dim == DimPattern], want, other)
	}
	var m matcher
	var err error
	switch r.dim {
	case DimLabel:
		m, err = newLabelMatcher(matchVal)
	case DimImage:
		m, err = newImageMatcher(matchVal)
	case DimProcess:
		m, err = newProcessMatcher(matchVal)
	case DimDomain:
		m, err = newDomainMatcher(matchVal)
	case DimCIDR:
		m, err = newCIDRMatcher(matchVal)
	case DimPort:
		m, err = newPortMatcher(matchVal)
	case DimPattern:
		m, err = parsePattern(matchVal)
	}
	if err != nil {
		e := err.(*Error)
		e.Rule, e.Line = idx, matchLine
		return rule{}, e
	}
	r.m = m
	switch {
	case hasExit:
		if hasAction && action != "proxy" {
			return fail(CodeBadExit, exitLine, "exit %q goes with %s: proxy or no %s, not %q", exitName_, want, want, action)
		}
		if isReservedExit(exitName_) {
			return fail(CodeBadExit, exitLine, "exit %q is a built-in route: write %s: %s", exitName_, want, exitName_)
		}
		if !exitName.MatchString(exitName_) {
			return fail(CodeBadExit, exitLine, "exit %q: a name is lower-case letters, digits, '.', '_' and '-'", exitName_)
		}
		if o.Exits != nil && !o.Exits(exitName_) {
			return fail(CodeBadExit, exitLine, "exit %q is not defined in the daemon's configuration", exitName_)
		}
		r.exit = exitName_
	case hasAction:
		exit, perr := parseExit(action, o, CodeBadAction, want)
		if perr != nil {
			perr.Rule, perr.Line = idx, actionLine
			return rule{}, perr
		}
		r.exit = exit
	default:
		return fail(CodeBadAction, n.Line, "no %s (want direct, proxy, deny, client or gateway, or exit: NAME)", want)
	}
	return r, nil
}

func (p *Policy) parseScript(n *yaml.Node, o LoadOptions) error {
	src, err := scalar(n, "script")
	if err != nil {
		return err
	}
	if len(src) > pac.MaxScriptBytes {
		return &Error{Code: CodeTooLarge, Line: n.Line, Msg: fmt.Sprintf("script is %d bytes, at most %d", len(src), pac.MaxScriptBytes)}
	}
	s, err := pac.Compile(p.name, src, o.PAC)
	if err != nil {
		e := &Error{Code: CodeScript, Line: n.Line, Msg: err.Error()}
		var ce *pac.CompileError
		if errors.As(err, &ce) {
			e.Code, e.Msg = Code(ce.Code), "script: "+ce.Msg
			if ce.Line > 0 {
				// A block scalar's text starts on the line after `script: |`.
				off := ce.Line - 1
				if n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
					off = ce.Line
				}
				e.Line = n.Line + off
			}
		}
		return e
	}
	p.script = s
	p.scriptLine = n.Line
	return nil
}
