package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// Containerd registers kl-runtime as a CRI runtime of containerd: a runtime named kl
// whose runc v2 shim execs kl-runtime instead of runc (options.BinaryName), selectable
// per pod with a RuntimeClass whose handler is kl, or with `ctr run --runtime`/nerdctl.
// The runtime allow-lists the pod annotation kl.egress.mode (pod_annotations), so a
// pod's own mode reaches kl-runtime as it reaches kl-cni. kl owns only the keys it sets
// there; anything else the operator adds under the runtime stays.
//
// The edit is textual, so the operator's comments, order and formatting survive: kl's
// tables are inserted after the last existing runtime table, indented and quoted like
// it, and the result is re-parsed and compared with the original to prove nothing else
// moved.
type Containerd struct {
	Name       string // runtime name; DefaultRuntimeName when ""
	BinaryName string // the wrapper binary; DefaultRuntimeBinary when ""
	// Version is the config layout to write into a file that does not say (empty or
	// missing): 2 (containerd 1.x, plugin io.containerd.grpc.v1.cri) or 3 (containerd
	// 2.x, plugin io.containerd.cri.v1.runtime). A file's own `version` wins.
	Version int
	// Default also makes kl's runtime the CRI plugin's default_runtime_name, in place
	// of a "runc" (or empty, or absent) one; Apply keeps what it replaced in StatePath
	// for uninstall to put back.
	Default bool
}

var _ defaultEditor = Containerd{}

func (c Containerd) name() string   { return or(c.Name, DefaultRuntimeName) }
func (c Containerd) binary() string { return or(c.BinaryName, DefaultRuntimeBinary) }

// RuntimesPath returns the key path of the table holding containerd's CRI runtimes in a
// config of the given layout version (1, 2 or 3).
func RuntimesPath(version int) ([]string, error) {
	switch version {
	case 1:
		return []string{"plugins", "cri", "containerd", "runtimes"}, nil
	case 2:
		return []string{"plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes"}, nil
	case 3:
		return []string{"plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes"}, nil
	}
	return nil, fmt.Errorf("unsupported containerd config version %d (want 1, 2 or 3)", version)
}

// tomlDoc is a parsed config.toml: its decoded value and where its tables and keys sit.
type tomlDoc struct {
	data     []byte
	value    map[string]any
	version  int
	lines    []int // byte offset of the start of each line
	sections []tomlSection
	keyvals  []tomlKeyval
}

type tomlSection struct {
	path    []string
	header  int    // line of the [header]
	bodyEnd int    // last line holding one of its key/values (header when none)
	indent  string // whitespace before '['
	quote   byte   // quote used for quoted keys in the header ('"' or '\''), 0 when none
}

type tomlKeyval struct {
	path             []string // full path: section path + dotted key
	first, end       int      // first and last line
	valStart, valEnd int      // byte offsets of the value's text
}

func parseTOML(data []byte, defVersion int) (*tomlDoc, error) {
	d := &tomlDoc{data: data, lines: []int{0}}
	for i, c := range data {
		if c == '\n' && i+1 < len(data) {
			d.lines = append(d.lines, i+1)
		}
	}
	if err := toml.Unmarshal(data, &d.value); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return nil, fmt.Errorf("invalid TOML at line %d column %d: %w", row, col, err)
		}
		return nil, fmt.Errorf("invalid TOML: %w", err)
	}
	if d.value == nil {
		d.value = map[string]any{}
	}
	switch v := d.value["version"].(type) {
	case nil:
		d.version = 1
		if len(bytes.TrimSpace(data)) == 0 || defVersion != 0 && len(d.value) == 0 {
			d.version = defVersion
		}
	case int64:
		d.version = int(v)
	default:
		return nil, fmt.Errorf("version is %v, not a number", v)
	}
	if d.version == 0 {
		return nil, errors.New("the config is empty and says no version: choose the layout (2 for containerd 1.x, 3 for containerd 2.x)")
	}

	var p unstable.Parser
	p.Reset(data)
	var cur []string
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			var path []string
			var quote byte
			it := e.Key()
			first := -1
			for it.Next() {
				n := it.Node()
				path = append(path, string(n.Data))
				if first < 0 {
					first = int(n.Raw.Offset)
				}
				if raw := p.Raw(n.Raw); len(raw) > 0 && (raw[0] == '"' || raw[0] == '\'') && quote == 0 {
					quote = raw[0]
				}
			}
			line := d.lineOf(first)
			ind := data[d.lines[line]:first]
			ind = ind[:len(ind)-len(bytes.TrimLeft(ind, " \t"))]
			d.sections = append(d.sections, tomlSection{path: path, header: line, bodyEnd: line, indent: string(ind), quote: quote})
			cur = path
		case unstable.KeyValue:
			path := append([]string(nil), cur...)
			it := e.Key()
			keyEnd := int(e.Raw.Offset)
			for it.Next() {
				n := it.Node()
				path = append(path, string(n.Data))
				keyEnd = int(n.Raw.Offset + n.Raw.Length)
			}
			// The value starts after the '=' and the blanks around it; the expression
			// ends with the value.
			val := keyEnd
			for val < len(data) && (data[val] == ' ' || data[val] == '\t' || data[val] == '=') {
				val++
			}
			end := int(e.Raw.Offset + e.Raw.Length)
			kv := tomlKeyval{path: path, first: d.lineOf(int(e.Raw.Offset)), end: d.lineOf(end - 1), valStart: val, valEnd: end}
			d.keyvals = append(d.keyvals, kv)
			if n := len(d.sections); n > 0 {
				d.sections[n-1].bodyEnd = kv.end
			}
		}
	}
	if err := p.Error(); err != nil {
		return nil, fmt.Errorf("invalid TOML: %w", err)
	}
	return d, nil
}

func (d *tomlDoc) lineOf(off int) int {
	lo, hi := 0, len(d.lines)-1
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if d.lines[mid] <= off {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

func hasPrefix(path, prefix []string) bool {
	return len(path) >= len(prefix) && reflect.DeepEqual(path[:len(prefix)], prefix)
}

// defaultRuntimePath is the key path of default_runtime_name, beside the runtimes table
// at rp.
func defaultRuntimePath(rp []string) []string {
	return append(rp[:len(rp)-1:len(rp)-1], "default_runtime_name")
}

// lookup walks a decoded TOML value along path.
func lookup(v map[string]any, path ...string) any {
	var cur any = v
	for _, k := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[k]
	}
	return cur
}

// ModeAnnotation is the pod annotation that selects a workload's egress mode
// (wire.LabelMode). containerd copies a pod's annotations into its containers' OCI specs
// only when the runtime allow-lists them in pod_annotations, so kl's runtime lists it:
// without it kl-runtime never sees the mode a pod asked for, while kl-cni, which
// containerd hands every pod annotation, does.
const ModeAnnotation = "kl.egress.mode"

// setting is one key of kl's runtime table that kl owns. Every other key there is the
// operator's and is never changed, only kept.
type setting struct {
	path   []string // below the runtime's table
	want   any      // the decoded value kl wants; nil: absent
	member string   // for a list kl owns one member of (pod_annotations): that member
}

// settings are what kl owns in its runtime table: the shim type, kl-runtime as the
// shim's binary, the cgroup driver of the runtime kl stands in for (sysd; nil when that
// runtime does not set it) and ModeAnnotation's place in pod_annotations.
func (c Containerd) settings(sysd any) []setting {
	return []setting{
		{path: []string{"runtime_type"}, want: "io.containerd.runc.v2"},
		{path: []string{"pod_annotations"}, member: ModeAnnotation},
		{path: []string{"options", "BinaryName"}, want: c.binary()},
		{path: []string{"options", "SystemdCgroup"}, want: sysd},
	}
}

// next returns the value the setting gives a key whose value is cur (nil: absent), and
// whether cur is that value already.
func (s setting) next(cur any) (any, bool, error) {
	if s.member == "" {
		return s.want, reflect.DeepEqual(cur, s.want), nil
	}
	if cur == nil {
		return []any{s.member}, false, nil
	}
	list, ok := cur.([]any)
	if !ok {
		return nil, false, fmt.Errorf("%s is %v, not a list of annotation names", strings.Join(s.path, "."), cur)
	}
	for _, x := range list {
		if _, ok := x.(string); !ok {
			return nil, false, fmt.Errorf("%s holds %v, not an annotation name", strings.Join(s.path, "."), x)
		}
	}
	if slices.Contains(list, any(s.member)) {
		return cur, true, nil
	}
	return append(slices.Clone(list), s.member), false, nil
}

// operatorPart returns kl's runtime table t without what kl owns (a copy): the part that
// belongs to the operator. Tables left empty go too.
func (c Containerd) operatorPart(t map[string]any) map[string]any {
	out := maps.Clone(t)
	for _, s := range c.settings(nil) {
		m := out
		for _, k := range s.path[:len(s.path)-1] {
			sub, ok := m[k].(map[string]any)
			if !ok {
				m = nil
				break
			}
			sub = maps.Clone(sub)
			m[k] = sub
			m = sub
		}
		if m == nil {
			continue
		}
		k := s.path[len(s.path)-1]
		if l, ok := m[k].([]any); ok && s.member != "" {
			if l = slices.DeleteFunc(slices.Clone(l), func(x any) bool { return x == any(s.member) }); len(l) > 0 {
				m[k] = l
				continue
			}
		}
		delete(m, k)
	}
	for k, v := range out {
		if sub, ok := v.(map[string]any); ok && len(sub) == 0 {
			delete(out, k)
		}
	}
	return out
}

func (c Containerd) validate() error {
	if strings.ContainsAny(c.binary(), "\"'\\\n\r\t") || !strings.HasPrefix(c.binary(), "/") {
		return fmt.Errorf("runtime binary %q: want an absolute path without quotes or control characters", c.binary())
	}
	if c.name() == "" || strings.ContainsAny(c.name(), "\"'\\.[] \t\n") {
		return fmt.Errorf("runtime name %q: want a plain name", c.name())
	}
	return nil
}

// errLayout marks a runtime table written in a way kl does not edit key by key (an
// inline table, dotted keys from another table).
var errLayout = errors.New("written in a way kl does not edit in place")

// Install adds kl's runtime tables. When kl's runtime is already there, only the keys kl
// owns (settings) are corrected, in place; everything else the operator put under kl's
// name stays as it is, and a runtime that already has kl's settings leaves the file
// unchanged. SystemdCgroup is copied from the default runtime's options so kl's
// containers use the same cgroup driver as the kubelet expects. With Default it also
// sets default_runtime_name (see setDefault).
func (c Containerd) Install(old []byte) ([]byte, error) {
	next, _, err := c.install(old)
	return next, err
}

// install is Install that also returns the default_runtime_name it replaced (prior),
// when it made kl's runtime the default.
func (c Containerd) install(old []byte) ([]byte, *defaultState, error) {
	next, err := c.addRuntime(old)
	if err != nil || !c.Default {
		return next, nil, err
	}
	return c.setDefault(next)
}

// addRuntime is Install without the default.
func (c Containerd) addRuntime(old []byte) ([]byte, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	d, err := parseTOML(old, c.Version)
	if err != nil {
		return nil, err
	}
	rp, err := RuntimesPath(d.version)
	if err != nil {
		return nil, err
	}
	// The cgroup driver of the runtime kl stands in for.
	def, _ := lookup(d.value, defaultRuntimePath(rp)...).(string)
	if def == "" || def == c.name() {
		def = "runc"
	}
	sysd := lookup(d.value, append(rp[:len(rp):len(rp)], def, "options", "SystemdCgroup")...)
	if _, ok := sysd.(bool); !ok {
		sysd = nil
	}
	sets := c.settings(sysd)
	kl := append(rp[:len(rp):len(rp)], c.name())
	base := old
	if cur := lookup(d.value, kl...); cur != nil {
		t, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("runtime %q is %v, not a table", c.name(), cur)
		}
		next, err := c.update(d, kl, sets)
		if err == nil {
			if bytes.Equal(next, old) {
				return old, nil
			}
			if err := c.check(old, next, sets); err != nil {
				return nil, err
			}
			return next, nil
		}
		if !errors.Is(err, errLayout) {
			return nil, err
		}
		// Rewrite the runtime as kl writes it, unless that loses the operator's settings.
		if op := c.operatorPart(t); len(op) > 0 {
			return nil, fmt.Errorf("runtime %q needs kl's settings but is %v, and rewriting it would drop settings of yours (%s): write it as a [%s] table, or remove it first",
				c.name(), err, strings.Join(slices.Sorted(maps.Keys(op)), ", "), tomlKey(kl, '"'))
		}
		if base, err = c.remove(old); err != nil {
			return nil, err
		}
	}

	if len(bytes.TrimSpace(base)) == 0 {
		base = fmt.Appendf(nil, "version = %d\n", d.version)
	} else {
		if base[len(base)-1] != '\n' {
			base = append(bytes.Clone(base), '\n')
		}
		if _, ok := d.value["version"]; !ok && d.version != 1 {
			// Comments only: the layout is the caller's choice, and the file must say so,
			// or containerd reads it as version 1. With no tables, the key can go last.
			base = fmt.Appendf(bytes.Clone(base), "version = %d\n", d.version)
		}
	}
	if d, err = parseTOML(base, c.Version); err != nil {
		return nil, err
	}

	// Where and how: after the last table under runtimes, indented like a sibling
	// runtime's table and quoted like the file quotes the plugin's name.
	after := len(d.lines) - 1
	var hdrInd, optInd string
	quote := byte('"')
	last, sib, sibOpt := -1, -1, -1
	for i, s := range d.sections {
		if !hasPrefix(s.path, rp) {
			continue
		}
		last = i
		if s.quote != 0 {
			quote = s.quote
		}
		switch {
		case len(s.path) == len(rp)+1 && sib < 0:
			sib = i
		case len(s.path) == len(rp)+2 && s.path[len(rp)+1] == "options" && sibOpt < 0:
			sibOpt = i
		}
	}
	if last >= 0 {
		after = d.sections[last].bodyEnd
		switch {
		case sib >= 0:
			hdrInd = d.sections[sib].indent
		case d.sections[last].path[len(d.sections[last].path)-1] == "runtimes":
			hdrInd = d.sections[last].indent + "  "
		}
	}
	optInd = hdrInd + "  "
	if sibOpt >= 0 {
		optInd = d.sections[sibOpt].indent
	}
	if d.version == 1 {
		quote = '"'
	}
	// kl's table and its options table, holding what the settings want.
	var main, opts strings.Builder
	fmt.Fprintf(&main, "\n%s[%s]\n", hdrInd, tomlKey(kl, quote))
	fmt.Fprintf(&opts, "\n%s[%s]\n", optInd, tomlKey(append(kl, "options"), quote))
	for _, s := range sets {
		v, _, _ := s.next(nil)
		if v == nil {
			continue
		}
		text, err := tomlValue(v, quote)
		if err != nil {
			return nil, err
		}
		if len(s.path) == 1 {
			fmt.Fprintf(&main, "%s  %s = %s\n", hdrInd, s.path[0], text)
		} else {
			fmt.Fprintf(&opts, "%s  %s = %s\n", optInd, s.path[1], text)
		}
	}
	blk := main.String() + opts.String()
	at := d.lineStart(after + 1)
	next := make([]byte, 0, len(base)+len(blk))
	next = append(next, base[:at]...)
	next = append(next, blk...)
	next = append(next, base[at:]...)

	if err := c.check(old, next, sets); err != nil {
		return nil, err
	}
	return next, nil
}

// update edits the keys kl owns in its existing runtime table kl, each where it is (a
// value replaced, a missing key added at the end of its table, a key kl wants absent
// removed), so the operator's keys, comments and order stay. It returns d's bytes when
// nothing needs changing, and errLayout when a key is not written where kl can edit it.
func (c Containerd) update(d *tomlDoc, kl []string, sets []setting) ([]byte, error) {
	hdr := d.section(kl)
	if hdr < 0 {
		return nil, fmt.Errorf("%w: no [%s] table", errLayout, tomlKey(kl, '"'))
	}
	quote := d.sections[hdr].quote
	if quote == 0 || d.version == 1 {
		quote = '"'
	}
	type edit struct {
		from, to int
		text     string
	}
	var edits []edit
	var newOpts []string // keys for an options table that does not exist yet
	for _, s := range sets {
		path := append(slices.Clone(kl), s.path...)
		cur := lookup(d.value, path...)
		nv, same, err := s.next(cur)
		if err != nil {
			return nil, fmt.Errorf("runtime %q: %w", c.name(), err)
		}
		if same {
			continue
		}
		name := s.path[len(s.path)-1]
		if kv := d.keyval(path); kv != nil {
			if nv == nil {
				edits = append(edits, edit{d.lineStart(kv.first), d.lineStart(kv.end + 1), ""})
				continue
			}
			q := quote
			if b := d.data[kv.valStart]; b == '"' || b == '\'' {
				q = b
			}
			if s.member != "" && cur != nil {
				// Add the member to the list as written, so the operator's members keep
				// their layout and comments.
				if at, pre, post, ok := arrayEnd(d.data[kv.valStart:kv.valEnd]); ok {
					text, err := tomlValue(s.member, quote)
					if err != nil {
						return nil, err
					}
					at += kv.valStart
					edits = append(edits, edit{at, at, pre + text + post})
					continue
				}
			}
			text, err := tomlValue(nv, q)
			if err != nil {
				return nil, err
			}
			edits = append(edits, edit{kv.valStart, kv.valEnd, text})
			continue
		}
		if cur != nil {
			return nil, fmt.Errorf("%w: %s is set in an inline table", errLayout, strings.Join(path, "."))
		}
		text, err := tomlValue(nv, quote)
		if err != nil {
			return nil, err
		}
		parent := path[:len(path)-1]
		if i := d.section(parent); i >= 0 {
			at := d.lineStart(d.sections[i].bodyEnd + 1)
			edits = append(edits, edit{at, at, d.keyIndent(i) + name + " = " + text + "\n"})
			continue
		}
		if lookup(d.value, parent...) != nil || len(s.path) != 2 {
			return nil, fmt.Errorf("%w: %s is not a [table]", errLayout, strings.Join(parent, "."))
		}
		newOpts = append(newOpts, name+" = "+text)
	}
	if len(newOpts) > 0 {
		// A new options table, after the last of kl's tables.
		last := hdr
		for i, sec := range d.sections {
			if hasPrefix(sec.path, kl) {
				last = i
			}
		}
		ind := d.sections[hdr].indent + "  "
		var b strings.Builder
		fmt.Fprintf(&b, "\n%s[%s]\n", ind, tomlKey(append(slices.Clone(kl), "options"), quote))
		for _, l := range newOpts {
			b.WriteString(ind + "  " + l + "\n")
		}
		at := d.lineStart(d.sections[last].bodyEnd + 1)
		edits = append(edits, edit{at, at, b.String()})
	}
	if len(edits) == 0 {
		return d.data, nil
	}
	// Edits never overlap; insertions at one place keep the order they were made in.
	slices.SortStableFunc(edits, func(a, b edit) int { return a.from - b.from })
	data := d.data
	if n := len(data); n > 0 && data[n-1] != '\n' && edits[len(edits)-1].from == n {
		// Something goes after the last line, which has no newline yet.
		data = append(slices.Clip(data), '\n')
		for i := range edits {
			if edits[i].from == n {
				edits[i].from, edits[i].to = n+1, n+1
			}
		}
	}
	var next []byte
	pos := 0
	for _, e := range edits {
		next = append(next, data[pos:e.from]...)
		next = append(next, e.text...)
		pos = e.to
	}
	return append(next, data[pos:]...), nil
}

// arrayEnd finds where one more element goes in the TOML array literal v (a list of
// strings, as pod_annotations is): the offset after its last element, or after its
// trailing comma, or after '[' when it has none, and the text to put before and after
// the new element there. Comments and line breaks inside the array stay where they are.
// ok is false when v is not an array literal it can read.
func arrayEnd(v []byte) (at int, pre, post string, ok bool) {
	if len(v) < 2 || v[0] != '[' || v[len(v)-1] != ']' {
		return 0, "", "", false
	}
	at, elems, comma := 1, 0, false
	for i := 1; i < len(v)-1; {
		switch c := v[i]; {
		case c == '#':
			for i < len(v)-1 && v[i] != '\n' {
				i++
			}
		case c == ',':
			if elems == 0 || comma {
				return 0, "", "", false
			}
			comma, at = true, i+1
			i++
		case c == '"' || c == '\'':
			delim := string(c)
			if i+2 < len(v) && v[i+1] == c && v[i+2] == c {
				delim = strings.Repeat(delim, 3)
			}
			j := i + len(delim)
			for {
				if j >= len(v)-1 {
					return 0, "", "", false
				}
				if c == '"' && v[j] == '\\' {
					j += 2
					continue
				}
				if bytes.HasPrefix(v[j:], []byte(delim)) {
					break
				}
				j++
			}
			i = j + len(delim)
			elems, comma, at = elems+1, false, i
		case c == ' ' || c == '\t' || c == '\r' || c == '\n':
			i++
		default:
			return 0, "", "", false
		}
	}
	switch {
	case elems == 0:
		return at, "", "", true
	case comma:
		return at, " ", ",", true
	}
	return at, ", ", "", true
}

// section returns the index of the [table] at path, -1 when there is none.
func (d *tomlDoc) section(path []string) int {
	for i, s := range d.sections {
		if slices.Equal(s.path, path) {
			return i
		}
	}
	return -1
}

// keyval returns the key/value that sets path itself, nil when there is none.
func (d *tomlDoc) keyval(path []string) *tomlKeyval {
	for i := range d.keyvals {
		if slices.Equal(d.keyvals[i].path, path) {
			return &d.keyvals[i]
		}
	}
	return nil
}

// keyIndent is the indentation of the key/values of section i: that of its first one,
// else its header's plus two spaces.
func (d *tomlDoc) keyIndent(i int) string {
	s := d.sections[i]
	for _, kv := range d.keyvals {
		if kv.first > s.header && kv.first <= s.bodyEnd && len(kv.path) == len(s.path)+1 {
			l := d.line(kv.first)
			return string(l[:len(l)-len(bytes.TrimLeft(l, " \t"))])
		}
	}
	return s.indent + "  "
}

// tomlKey writes a dotted key, quoting the parts that need it with quote.
func tomlKey(path []string, quote byte) string {
	parts := make([]string, len(path))
	for i, p := range path {
		if p != "" && strings.Trim(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") == "" {
			parts[i] = p
		} else {
			parts[i] = string(quote) + p + string(quote)
		}
	}
	return strings.Join(parts, ".")
}

// tomlValue writes the values kl sets: strings (in quote when they need no escaping),
// booleans and lists of those.
func tomlValue(v any, quote byte) (string, error) {
	switch v := v.(type) {
	case string:
		if !strings.ContainsFunc(v, func(r rune) bool { return r < ' ' || r == 0x7f || r == '"' || r == '\'' || r == '\\' }) {
			return string(quote) + v + string(quote), nil
		}
		// JSON's escapes are TOML's, except that TOML also escapes DEL.
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			return "", err
		}
		return strings.ReplaceAll(strings.TrimSuffix(b.String(), "\n"), "\x7f", `\u007f`), nil
	case bool:
		return strconv.FormatBool(v), nil
	case []any:
		parts := make([]string, len(v))
		for i, x := range v {
			s, err := tomlValue(x, quote)
			if err != nil {
				return "", err
			}
			parts[i] = s
		}
		return "[" + strings.Join(parts, ", ") + "]", nil
	}
	return "", fmt.Errorf("cannot write %v (%T) as TOML", v, v)
}

// Uninstall removes kl's runtime tables, whatever else the operator put in them, and
// points default_runtime_name back at runc when it names kl's runtime (containerd's CRI
// plugin does not start with a default runtime that is not defined). (Apply instead
// puts back the default_runtime_name that install --default replaced; see
// editDefault.)
func (c Containerd) Uninstall(old []byte) ([]byte, error) {
	return c.uninstall(old, nil)
}

// uninstall is Uninstall that, when default_runtime_name names kl's runtime and st
// records what it was before, puts that back instead of runc.
func (c Containerd) uninstall(old []byte, st *defaultState) ([]byte, error) {
	if len(bytes.TrimSpace(old)) == 0 {
		return old, nil
	}
	next, err := c.remove(old)
	if err != nil {
		return nil, err
	}
	if next, err = c.restoreDefault(next, st); err != nil {
		return nil, err
	}
	if bytes.Equal(next, old) {
		return old, nil
	}
	if err := c.check(old, next, nil); err != nil {
		return nil, err
	}
	return next, nil
}

// remove takes kl's runtime tables out (and any key/value that defines part of them),
// together with the blank line that introduced each table.
func (c Containerd) remove(old []byte) ([]byte, error) {
	d, err := parseTOML(old, c.Version)
	if err != nil {
		return nil, err
	}
	rp, err := RuntimesPath(d.version)
	if err != nil {
		return nil, err
	}
	kl := append(rp[:len(rp):len(rp)], c.name())
	drop := make([]bool, len(d.lines))
	for _, s := range d.sections {
		if !hasPrefix(s.path, kl) {
			continue
		}
		from := s.header
		if from > 0 && len(bytes.TrimSpace(d.line(from-1))) == 0 {
			from--
		}
		for l := from; l <= s.bodyEnd; l++ {
			drop[l] = true
		}
	}
	for _, kv := range d.keyvals {
		if hasPrefix(kv.path, kl) {
			for l := kv.first; l <= kv.end; l++ {
				drop[l] = true
			}
		}
	}
	next := []byte{}
	for i := range d.lines {
		if !drop[i] {
			next = append(next, d.line(i)...)
		}
	}
	if bytes.Equal(next, old) {
		return old, nil
	}
	return next, nil
}

// restoreDefault gives default_runtime_name back, where it names kl's runtime: the value
// st records (removing the key when st records there was none), runc without a record.
// The key keeps its place and its quotes.
func (c Containerd) restoreDefault(data []byte, st *defaultState) ([]byte, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return data, nil
	}
	d, err := parseTOML(data, c.Version)
	if err != nil {
		return nil, err
	}
	rp, err := RuntimesPath(d.version)
	if err != nil {
		return nil, err
	}
	path := defaultRuntimePath(rp)
	if v, _ := lookup(d.value, path...).(string); v != c.name() {
		return data, nil
	}
	kv := d.keyval(path)
	if kv == nil {
		return nil, fmt.Errorf("default_runtime_name is %q, in an inline table kl does not edit: set it to \"runc\" first (containerd does not start with a default runtime that is not defined)", c.name())
	}
	to := "runc"
	if st != nil && st.DefaultRuntime == nil {
		// There was none: the line install added goes, and the table it added for it.
		next := bytes.Clone(data[:d.lineStart(kv.first)])
		next = append(next, data[d.lineStart(kv.end+1):]...)
		if st.AddedTable {
			return c.dropAddedTable(next, path[:len(path)-1])
		}
		return next, nil
	} else if st != nil {
		to = *st.DefaultRuntime
	}
	return replaceTOMLString(data, kv, to)
}

// replaceTOMLString returns data with kv's value replaced by the string s, quoted as
// the value was ('…' or "…").
func replaceTOMLString(data []byte, kv *tomlKeyval, s string) ([]byte, error) {
	q := data[kv.valStart]
	if q != '\'' {
		q = '"'
	}
	text, err := tomlValue(s, q)
	if err != nil {
		return nil, err
	}
	next := bytes.Clone(data[:kv.valStart])
	next = append(next, text...)
	return append(next, data[kv.valEnd:]...), nil
}

// setDefault makes kl's runtime the CRI plugin's default_runtime_name: in place of a
// "runc" (or empty) one, which it returns as prior, or, when there is none, as a new
// last key of the [….containerd] table, returning an empty prior; a config without
// that table gets it (see addDefaultTable), and prior says so. prior is nil when kl's
// runtime already was the default.
func (c Containerd) setDefault(data []byte) ([]byte, *defaultState, error) {
	d, err := parseTOML(data, c.Version)
	if err != nil {
		return nil, nil, err
	}
	rp, err := RuntimesPath(d.version)
	if err != nil {
		return nil, nil, err
	}
	path := defaultRuntimePath(rp)
	table := path[:len(path)-1]
	var next []byte
	prior := &defaultState{Runtime: c.name()}
	cur := lookup(d.value, path...)
	switch s, ok := cur.(string); {
	case cur == nil && d.section(table) < 0:
		if next, err = c.addDefaultTable(d, table); err != nil {
			return nil, nil, err
		}
		prior.AddedTable = true
	case cur == nil:
		i := d.section(table)
		quote := d.sections[i].quote
		if quote == 0 || d.version == 1 {
			quote = '"'
		}
		text, err := tomlValue(c.name(), quote)
		if err != nil {
			return nil, nil, err
		}
		at := d.lineStart(d.sections[i].bodyEnd + 1)
		line := d.keyIndent(i) + "default_runtime_name = " + text + "\n"
		if at == len(data) && at > 0 && data[at-1] != '\n' {
			line = "\n" + line
		}
		next = append(bytes.Clone(data[:at]), line...)
		next = append(next, data[at:]...)
	case !ok:
		return nil, nil, fmt.Errorf("default_runtime_name is %v, not a string", cur)
	case s == c.name():
		return data, nil, nil
	case s == "runc" || s == "":
		kv := d.keyval(path)
		if kv == nil {
			return nil, nil, fmt.Errorf("default_runtime_name is set in an inline table kl does not edit: write [%s] as a table first", tomlKey(table, '"'))
		}
		if next, err = replaceTOMLString(data, kv, c.name()); err != nil {
			return nil, nil, err
		}
		prior.DefaultRuntime = &s
	default:
		// kl-runtime execs runc; taking over another default runtime (nvidia, crun,
		// runsc, kata) would silently change how every pod runs.
		return nil, nil, fmt.Errorf(`default_runtime_name is %q; kl would replace it (set it to "runc" or remove it first)`, s)
	}
	if err := c.checkDefault(data, next); err != nil {
		return nil, nil, err
	}
	return next, prior, nil
}

// addDefaultTable adds the [….containerd] table, holding default_runtime_name = kl's
// runtime, to a config that has the table only through its sub-tables (kl's runtime's,
// at least, which addRuntime wrote): just before the first of them, indented and quoted
// like it.
func (c Containerd) addDefaultTable(d *tomlDoc, table []string) ([]byte, error) {
	for _, s := range d.sections {
		if !hasPrefix(s.path, table) {
			continue
		}
		quote := s.quote
		if quote == 0 || d.version == 1 {
			quote = '"'
		}
		text, err := tomlValue(c.name(), quote)
		if err != nil {
			return nil, err
		}
		at := d.lineStart(s.header)
		next := bytes.Clone(d.data[:at])
		next = fmt.Appendf(next, "%s[%s]\n%s  default_runtime_name = %s\n\n", s.indent, tomlKey(table, quote), s.indent, text)
		next = append(next, d.data[at:]...)
		if _, err := parseTOML(next, c.Version); err != nil {
			// The table is defined by dotted keys, which a [header] may not define again.
			break
		}
		return next, nil
	}
	return nil, fmt.Errorf("default_runtime_name: [%s] is not written as a table kl can add the key to (dotted keys, or an inline table): write it as a [%[1]s] table, with default_runtime_name = \"runc\", first", tomlKey(table, '"'))
}

// dropAddedTable takes out the [….containerd] table that addDefaultTable added, with
// the blank line before it, once it holds no key of its own (its sub-tables are not in
// it: they keep their own headers). A table followed by a comment stays.
func (c Containerd) dropAddedTable(data []byte, table []string) ([]byte, error) {
	d, err := parseTOML(data, c.Version)
	if err != nil {
		return nil, err
	}
	i := d.section(table)
	if i < 0 || d.sections[i].bodyEnd != d.sections[i].header {
		return data, nil
	}
	from, to := d.sections[i].header, d.sections[i].header+1
	if to < len(d.lines) {
		if l := bytes.TrimSpace(d.line(to)); len(l) > 0 && l[0] != '[' {
			return data, nil
		}
	}
	if from > 0 && len(bytes.TrimSpace(d.line(from-1))) == 0 {
		from--
	}
	next := bytes.Clone(data[:d.lineStart(from)])
	return append(next, data[d.lineStart(to):]...), nil
}

// checkDefault proves that setDefault made kl's runtime the default and changed nothing
// else.
func (c Containerd) checkDefault(before, after []byte) error {
	a, err := parseTOML(before, c.Version)
	if err != nil {
		return fmt.Errorf("re-read original: %w", err)
	}
	b, err := parseTOML(after, c.Version)
	if err != nil {
		return fmt.Errorf("edit produced invalid TOML (a bug): %w", err)
	}
	rp, err := RuntimesPath(b.version)
	if err != nil {
		return err
	}
	path := defaultRuntimePath(rp)
	if got := lookup(b.value, path...); got != c.name() {
		return fmt.Errorf("default_runtime_name after the edit is %v, not %q (a bug); nothing written", got, c.name())
	}
	for _, v := range []map[string]any{a.value, b.value} {
		if m, ok := lookup(v, path[:len(path)-1]...).(map[string]any); ok {
			delete(m, path[len(path)-1])
		}
	}
	if !reflect.DeepEqual(a.value, b.value) {
		return errors.New("edit would change more than default_runtime_name (a bug); nothing written")
	}
	return nil
}

// defaultValue is the config's default_runtime_name as decoded, nil when it has none
// (or does not parse).
func (c Containerd) defaultValue(data []byte) any {
	d, err := parseTOML(data, c.Version)
	if err != nil {
		return nil
	}
	rp, err := RuntimesPath(d.version)
	if err != nil {
		return nil
	}
	return lookup(d.value, defaultRuntimePath(rp)...)
}

// currentDefault is the config's default_runtime_name, "" when it has none (or does
// not parse).
func (c Containerd) currentDefault(data []byte) string {
	s, _ := c.defaultValue(data).(string)
	return s
}

// hasRuntime reports whether the config defines kl's runtime.
func (c Containerd) hasRuntime(data []byte) bool {
	d, err := parseTOML(data, c.Version)
	if err != nil {
		return false
	}
	rp, err := RuntimesPath(d.version)
	if err != nil {
		return false
	}
	return lookup(d.value, append(rp[:len(rp):len(rp)], c.name())...) != nil
}

// emptyRuntimes is false: uninstall takes out only kl's own tables, never one that
// holds them.
func (c Containerd) emptyRuntimes([]byte) bool { return false }

// blank reports whether data is the `version = N` line install starts a config.toml it
// creates with.
func (c Containerd) blank(data []byte) bool {
	d, err := parseTOML(data, c.Version)
	return err == nil && string(data) == fmt.Sprintf("version = %d\n", d.version)
}

// notes tells what an edit changed beyond kl's runtime: the CRI plugin's default
// runtime. st is the record uninstall put the default back from (nil: none).
func (c Containerd) notes(old, next []byte, uninstall bool, st *defaultState) []string {
	oldV, nextV := c.defaultValue(old), c.defaultValue(next)
	was, _ := oldV.(string)
	now, _ := nextV.(string)
	recorded := st != nil && st.Runtime == c.name() && st.DefaultRuntime != nil
	switch {
	case uninstall && was == c.name() && nextV == nil:
		return []string{fmt.Sprintf(`default_runtime_name was %q; removed, as it was before kl was installed`, c.name())}
	case uninstall && was == c.name() && recorded && now == *st.DefaultRuntime:
		return []string{fmt.Sprintf(`default_runtime_name was %q; set back to %q, as it was before kl was installed`, c.name(), now)}
	case uninstall && was == c.name() && now == "runc":
		return []string{fmt.Sprintf(`default_runtime_name was %q; set to "runc" (containerd's CRI plugin does not start with a default runtime that is not defined)`, c.name())}
	case uninstall && was == c.name() && now != c.name():
		return []string{fmt.Sprintf(`default_runtime_name was %q; set back to %q, as it was before kl was installed`, c.name(), now)}
	case !uninstall && now == c.name() && oldV == nil:
		return []string{fmt.Sprintf(`default_runtime_name set to %q; uninstall removes it again`, c.name())}
	case !uninstall && now == c.name() && was != c.name():
		return []string{fmt.Sprintf(`default_runtime_name was %q; set to %q, and uninstall sets it back`, was, c.name())}
	}
	return nil
}

// line returns line i with its newline.
func (d *tomlDoc) line(i int) []byte {
	return d.data[d.lines[i]:d.lineStart(i+1)]
}

// lineStart returns the byte offset of line l; past the last line, the end of the data.
func (d *tomlDoc) lineStart(l int) int {
	if l < len(d.lines) {
		return d.lines[l]
	}
	return len(d.data)
}

// check proves the edit touched only what kl owns. With sets (an install) kl's runtime
// must hold every setting, and both documents, with only the operator's part of kl's
// runtime, must decode to the same value. Without (an uninstall) kl's runtime must be
// gone, default_runtime_name must not name it, and both documents without kl's runtime
// (and without a default_runtime_name of kl, runc or "", what uninstall puts back) must
// decode to the same value.
func (c Containerd) check(before, after []byte, sets []setting) error {
	a, err := parseTOML(before, c.Version)
	if err != nil {
		return fmt.Errorf("re-read original: %w", err)
	}
	b, err := parseTOML(after, c.Version)
	if err != nil {
		return fmt.Errorf("edit produced invalid TOML (a bug or an unusual layout, e.g. runtimes as an inline table): %w", err)
	}
	rp, err := RuntimesPath(b.version)
	if err != nil {
		return err
	}
	got := lookup(b.value, append(rp[:len(rp):len(rp)], c.name())...)
	defPath := defaultRuntimePath(rp)
	switch {
	case sets == nil && got != nil:
		return fmt.Errorf("runtime %q is still defined after the edit (defined in a way kl does not edit?); nothing written", c.name())
	case sets == nil && lookup(b.value, defPath...) == c.name():
		return fmt.Errorf("default_runtime_name still names runtime %q after the edit (a bug); nothing written", c.name())
	case sets != nil:
		t, _ := got.(map[string]any)
		for _, s := range sets {
			if _, same, _ := s.next(lookup(t, s.path...)); !same || t == nil {
				return fmt.Errorf("runtime %q after the edit has %s = %v (a bug); nothing written", c.name(), strings.Join(s.path, "."), lookup(t, s.path...))
			}
		}
	}
	for _, v := range []map[string]any{a.value, b.value} {
		// First the default (so that a table left empty without it goes as well:
		// uninstall takes out the key install --default added).
		if sets == nil {
			if m, ok := lookup(v, defPath[:len(defPath)-1]...).(map[string]any); ok && (m[defPath[len(defPath)-1]] == c.name() || m[defPath[len(defPath)-1]] == "runc" || m[defPath[len(defPath)-1]] == "") {
				delete(m, defPath[len(defPath)-1])
			}
		}
		// Take kl's runtime (or what kl owns of it) out, then the tables that only held
		// it (kl creates them in a config that had no runtime tables).
		for i := len(rp); i >= 0; i-- {
			m, ok := lookup(v, rp[:i]...).(map[string]any)
			if !ok {
				continue
			}
			if i < len(rp) {
				if sub, ok := m[rp[i]].(map[string]any); ok && len(sub) == 0 {
					delete(m, rp[i])
				}
				continue
			}
			t, ok := m[c.name()].(map[string]any)
			if op := c.operatorPart(t); sets != nil && ok && len(op) > 0 {
				m[c.name()] = op
			} else {
				delete(m, c.name())
			}
		}
		if _, ok := a.value["version"]; !ok {
			// An install into a file that said no version writes the one it chose.
			delete(v, "version")
		}
	}
	if !reflect.DeepEqual(a.value, b.value) {
		return errors.New("edit would change more than kl's runtime (a bug); nothing written")
	}
	return nil
}
