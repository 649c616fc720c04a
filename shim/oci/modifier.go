package oci

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// A Modifier makes one kind of edit to a spec. Applying it twice gives the same spec as
// applying it once.
type Modifier interface {
	Modify(s *Spec) error
	String() string
}

// List applies modifiers in order and stops at the first error.
type List []Modifier

// Modify applies every modifier of the list.
func (l List) Modify(s *Spec) error {
	for _, m := range l {
		if err := m.Modify(s); err != nil {
			return fmt.Errorf("%s: %w", m, err)
		}
	}
	return nil
}

func (l List) String() string {
	names := make([]string, len(l))
	for i, m := range l {
		names[i] = m.String()
	}
	return "[" + strings.Join(names, ", ") + "]"
}

// Var is one environment variable to inject.
type Var struct{ Name, Value string }

// Env injects environment variables into process.env. Names are grouped without regard
// to case (HTTP_PROXY and http_proxy are one group) because tools disagree about which
// spelling they read: if the spec already sets any spelling of a group, the whole group is
// left to the spec, unless the group is forced, in which case every spelling the spec had
// is replaced by kl's, or merged, in which case every spelling gets the spec's entries and
// kl's in one list. A merged group is a comma-separated list (NO_PROXY): leaving it to
// the image would drop kl's own entries, and those (loopback, where the relay listens) are
// what keeps the container's traffic to itself off the proxy.
type Env struct {
	Vars  []Var
	Force []string // group names (any case) kl overrides
	Merge []string // group names (any case) whose lists kl merges with the spec's
	// Join merges the lists of a merged group, the spec's entries first, into one value;
	// it must give the same value when applied to its own result (Modify is applied
	// twice). nil: entries trimmed, empty ones and repeats dropped, order kept.
	Join func(lists ...[]string) string
}

var _ Modifier = Env{}

func (e Env) String() string { return fmt.Sprintf("env(%d variables)", len(e.Vars)) }

// Modify implements Modifier.
func (e Env) Modify(s *Spec) error {
	env, err := s.Env()
	if err != nil {
		return err
	}
	forced := func(group string) bool {
		return slices.ContainsFunc(e.Force, func(f string) bool { return f == "*" || strings.EqualFold(f, group) })
	}
	merged := func(group string) bool {
		return slices.ContainsFunc(e.Merge, func(m string) bool { return strings.EqualFold(m, group) })
	}
	// The spec's entries of every group, all spellings, in the spec's order.
	present := map[string][]string{}
	for _, kv := range env {
		g := strings.ToUpper(envName(kv))
		_, val, _ := strings.Cut(kv, "=")
		present[g] = append(present[g], strings.Split(val, ",")...)
	}
	// Decide per group first: a group is skipped when the spec had it before this call,
	// unless kl forces or merges it.
	skip := map[string]bool{}
	join := e.Join
	if join == nil {
		join = joinList
	}
	vars := slices.Clone(e.Vars)
	for i, v := range vars {
		g := strings.ToUpper(v.Name)
		old, had := present[g]
		switch {
		case forced(g) || !had:
		case merged(g):
			vars[i].Value = join(old, strings.Split(v.Value, ","))
		default:
			skip[g] = true
		}
	}
	// A forced group takes the place of the spec's first entry of that group, so a second
	// application leaves the order as the first one did; other new groups are appended.
	byGroup := map[string][]string{}
	var order []string
	for _, v := range vars {
		g := strings.ToUpper(v.Name)
		if skip[g] {
			continue
		}
		if _, ok := byGroup[g]; !ok {
			order = append(order, g)
		}
		byGroup[g] = append(byGroup[g], v.Name+"="+v.Value)
	}
	emitted := map[string]bool{}
	out := env[:0:0]
	for _, kv := range env {
		g := strings.ToUpper(envName(kv))
		if _, ours := byGroup[g]; !ours {
			out = append(out, kv)
			continue
		}
		if !emitted[g] {
			out = append(out, byGroup[g]...)
			emitted[g] = true
		}
	}
	for _, g := range order {
		if !emitted[g] {
			out = append(out, byGroup[g]...)
		}
	}
	return s.setEnv(out)
}

// joinList is Env's default Join.
func joinList(lists ...[]string) string {
	var out []string
	for _, l := range lists {
		for _, e := range l {
			if e = strings.TrimSpace(e); e != "" && !slices.Contains(out, e) {
				out = append(out, e)
			}
		}
	}
	return strings.Join(out, ",")
}

func envName(kv string) string {
	if i := strings.IndexByte(kv, '='); i >= 0 {
		return kv[:i]
	}
	return kv
}

// Mount adds a mount. Any mount the spec already has at the same destination, or at one
// of the Replace destinations, is removed first, so a workload cannot put its own file
// where kl's belongs, and a second application (even one that picked the other of two
// alternative mounts) leaves exactly one of kl's.
type Mount struct {
	Destination string
	Type        string
	Source      string
	Options     []string
	Replace     []string // further destinations whose mounts are dropped
}

var _ Modifier = Mount{}

func (m Mount) String() string { return fmt.Sprintf("mount(%s -> %s)", m.Source, m.Destination) }

// Modify implements Modifier.
func (m Mount) Modify(s *Spec) error {
	if !filepath.IsAbs(m.Destination) || !filepath.IsAbs(m.Source) {
		return fmt.Errorf("mount source %q and destination %q must be absolute paths", m.Source, m.Destination)
	}
	list, _ := s.doc["mounts"].([]any)
	drop := map[string]bool{filepath.Clean(m.Destination): true}
	for _, r := range m.Replace {
		if !filepath.IsAbs(r) {
			return fmt.Errorf("mount destination %q to replace must be an absolute path", r)
		}
		drop[filepath.Clean(r)] = true
	}
	out := make([]any, 0, len(list)+1)
	for _, x := range list {
		if mm, ok := x.(map[string]any); ok {
			if d, _ := mm["destination"].(string); d != "" && drop[filepath.Clean(d)] {
				continue
			}
		}
		out = append(out, x)
	}
	opts := make([]any, len(m.Options))
	for i, o := range m.Options {
		opts[i] = o
	}
	out = append(out, map[string]any{
		"destination": m.Destination,
		"type":        m.Type,
		"source":      m.Source,
		"options":     opts,
	})
	s.doc["mounts"] = out
	return nil
}

// Hook adds one OCI hook at a lifecycle stage (createRuntime, poststop, …), after the
// stage's other hooks or, with First, before them. An existing hook with the same path
// and the same last argument (the hook's subcommand) is replaced, so the hook is never
// listed twice.
type Hook struct {
	Stage   string
	Path    string
	Args    []string // args[0] is the program name, as in the OCI spec
	Timeout int      // seconds; 0 = none
	// First runs the hook before the stage's other hooks. The runtime stops a stage at
	// its first failing hook, so only a hook listed first is sure to run.
	First bool
}

var _ Modifier = Hook{}

func (h Hook) String() string { return fmt.Sprintf("hook(%s %s)", h.Stage, strings.Join(h.Args, " ")) }

// Modify implements Modifier.
func (h Hook) Modify(s *Spec) error {
	if !filepath.IsAbs(h.Path) {
		return fmt.Errorf("hook path %q must be absolute", h.Path)
	}
	hooks, _ := s.doc["hooks"].(map[string]any)
	if hooks == nil {
		hooks = map[string]any{}
	}
	var list []any
	if x, ok := hooks[h.Stage]; ok && x != nil {
		l, ok := x.([]any)
		if !ok {
			return fmt.Errorf("%w: hooks.%s is %s, not an array", ErrMalformed, h.Stage, kind(x))
		}
		list = l
	}
	out := make([]any, 0, len(list)+1)
	for _, x := range list {
		if h.same(x) {
			continue
		}
		out = append(out, x)
	}
	args := make([]any, len(h.Args))
	for i, a := range h.Args {
		args[i] = a
	}
	entry := map[string]any{"path": h.Path, "args": args}
	if h.Timeout > 0 {
		entry["timeout"] = h.Timeout
	}
	if h.First {
		out = append([]any{entry}, out...)
	} else {
		out = append(out, entry)
	}
	hooks[h.Stage] = out
	s.doc["hooks"] = hooks
	return nil
}

func (h Hook) same(x any) bool {
	m, ok := x.(map[string]any)
	if !ok {
		return false
	}
	if p, _ := m["path"].(string); p != h.Path {
		return false
	}
	args, _ := m["args"].([]any)
	if len(args) == 0 || len(h.Args) == 0 {
		return len(args) == len(h.Args)
	}
	last, _ := args[len(args)-1].(string)
	return last == h.Args[len(h.Args)-1]
}

// Annotation sets one annotation of the spec, replacing the value it had; an empty Value
// removes it.
type Annotation struct{ Key, Value string }

var _ Modifier = Annotation{}

func (a Annotation) String() string { return fmt.Sprintf("annotation(%s=%s)", a.Key, a.Value) }

// Modify implements Modifier.
func (a Annotation) Modify(s *Spec) error {
	if a.Key == "" {
		return fmt.Errorf("annotation without a key")
	}
	ann, _ := s.doc["annotations"].(map[string]any)
	if ann == nil && a.Value == "" {
		return nil
	}
	if ann == nil {
		ann = map[string]any{}
	}
	if a.Value == "" {
		delete(ann, a.Key)
	} else {
		ann[a.Key] = a.Value
	}
	s.doc["annotations"] = ann
	return nil
}
