package install

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// Containerd registers kl-runtime as a CRI runtime of containerd: a runtime named kl
// whose runc v2 shim execs kl-runtime instead of runc (options.BinaryName), selectable
// per pod with a RuntimeClass whose handler is kl, or with `ctr run --runtime`/nerdctl.
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
}

var _ Editor = Containerd{}

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
	path       []string // full path: section path + dotted key
	first, end int      // first and last line
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
			for it.Next() {
				path = append(path, string(it.Node().Data))
			}
			kv := tomlKeyval{path: path, first: d.lineOf(int(e.Raw.Offset)), end: d.lineOf(int(e.Raw.Offset+e.Raw.Length) - 1)}
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

// want is kl's runtime table as decoded TOML, for comparisons.
func (c Containerd) want(systemdCgroup any) map[string]any {
	opts := map[string]any{"BinaryName": c.binary()}
	if systemdCgroup != nil {
		opts["SystemdCgroup"] = systemdCgroup
	}
	return map[string]any{"runtime_type": "io.containerd.runc.v2", "options": opts}
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

// Install adds kl's runtime tables. When kl's runtime is already there with the same
// settings the file is returned unchanged; other settings under kl's name are replaced.
// SystemdCgroup is copied from the default runtime's options so kl's containers use the
// same cgroup driver as the kubelet expects.
func (c Containerd) Install(old []byte) ([]byte, error) {
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
	def, _ := lookup(d.value, append(rp[:len(rp)-1:len(rp)-1], "default_runtime_name")...).(string)
	if def == "" || def == c.name() {
		def = "runc"
	}
	sysd := lookup(d.value, append(rp[:len(rp):len(rp)], def, "options", "SystemdCgroup")...)
	want := c.want(sysd)
	if cur := lookup(d.value, append(rp[:len(rp):len(rp)], c.name())...); cur != nil {
		if reflect.DeepEqual(cur, want) {
			return old, nil
		}
		if old, err = c.Uninstall(old); err != nil {
			return nil, err
		}
		if d, err = parseTOML(old, c.Version); err != nil {
			return nil, err
		}
	}

	base := old
	if len(bytes.TrimSpace(base)) == 0 {
		base = fmt.Appendf(nil, "version = %d\n", d.version)
	} else if base[len(base)-1] != '\n' {
		base = append(bytes.Clone(base), '\n')
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
	q := func(s string) string { return string(quote) + s + string(quote) }
	key := func(path []string) string {
		parts := make([]string, len(path))
		for i, p := range path {
			if strings.Trim(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") == "" {
				parts[i] = p
			} else {
				parts[i] = q(p)
			}
		}
		return strings.Join(parts, ".")
	}
	kl := append(rp[:len(rp):len(rp)], c.name())
	var blk strings.Builder
	fmt.Fprintf(&blk, "\n%s[%s]\n", hdrInd, key(kl))
	fmt.Fprintf(&blk, "%s  runtime_type = %s\n", hdrInd, q("io.containerd.runc.v2"))
	fmt.Fprintf(&blk, "\n%s[%s]\n", optInd, key(append(kl, "options")))
	fmt.Fprintf(&blk, "%s  BinaryName = %s\n", optInd, q(c.binary()))
	if b, ok := sysd.(bool); ok {
		fmt.Fprintf(&blk, "%s  SystemdCgroup = %t\n", optInd, b)
	}
	at := len(base)
	if after+1 < len(d.lines) {
		at = d.lines[after+1]
	}
	next := make([]byte, 0, len(base)+blk.Len())
	next = append(next, base[:at]...)
	next = append(next, blk.String()...)
	next = append(next, base[at:]...)

	if err := c.check(old, next, want); err != nil {
		return nil, err
	}
	return next, nil
}

// Uninstall removes kl's runtime tables (and any key/value that defines part of them),
// together with the blank line that introduced each table.
func (c Containerd) Uninstall(old []byte) ([]byte, error) {
	if len(bytes.TrimSpace(old)) == 0 {
		return old, nil
	}
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
	var next []byte
	for i := range d.lines {
		if !drop[i] {
			next = append(next, d.line(i)...)
		}
	}
	if bytes.Equal(next, old) {
		return old, nil
	}
	if next == nil {
		next = []byte{}
	}
	if err := c.check(old, next, nil); err != nil {
		return nil, err
	}
	return next, nil
}

// line returns line i with its newline.
func (d *tomlDoc) line(i int) []byte {
	end := len(d.data)
	if i+1 < len(d.lines) {
		end = d.lines[i+1]
	}
	return d.data[d.lines[i]:end]
}

// check proves the edit touched only kl's runtime: both documents, without it, decode
// to the same value, and kl's runtime decodes to want (nil: absent).
func (c Containerd) check(before, after []byte, want map[string]any) error {
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
	switch {
	case want == nil && got != nil:
		return fmt.Errorf("runtime %q is still defined after the edit (defined in a way kl does not edit?); nothing written", c.name())
	case want != nil && !reflect.DeepEqual(got, want):
		return fmt.Errorf("runtime %q after the edit is %v, want %v (a bug); nothing written", c.name(), got, want)
	}
	for _, v := range []map[string]any{a.value, b.value} {
		// Take kl's runtime out, then the tables that only held it (kl creates them in
		// a config that had no runtime tables).
		for i := len(rp); i >= 0; i-- {
			m, ok := lookup(v, rp[:i]...).(map[string]any)
			if !ok {
				continue
			}
			if i == len(rp) {
				delete(m, c.name())
			} else if sub, ok := m[rp[i]].(map[string]any); ok && len(sub) == 0 {
				delete(m, rp[i])
			}
		}
		if len(bytes.TrimSpace(before)) == 0 {
			delete(v, "version")
		}
	}
	if !reflect.DeepEqual(a.value, b.value) {
		return errors.New("edit would change more than kl's runtime (a bug); nothing written")
	}
	return nil
}
