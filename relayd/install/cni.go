package install

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"
)

// CNI adds kl-cni as the last plugin of a CNI network configuration list (the chained
// plugin runs after the main one has given the pod its interface and addresses), the
// way istio-cni's install-cni inserts itself.
type CNI struct {
	Type string         // the plugin's type, i.e. its binary's name; DefaultCNIType when ""
	Conf map[string]any // further keys of kl's entry (e.g. "socket"); written sorted by key
	// Versions are the CNI spec versions the installed kl-cni supports (PluginVersions).
	// When set, Install refuses a conflist whose cniVersion is not among them: the
	// runtime would call every plugin with that version, kl-cni would refuse it, and no
	// pod on the node could start. nil skips the check.
	Versions []string
}

// DefaultCNICapabilities is the "capabilities" of kl's entry unless Conf sets its own:
// it asks the runtime (containerd 1.7+) for the pod's annotations, where a pod's
// kl.egress.mode is read.
var DefaultCNICapabilities = map[string]any{"io.kubernetes.cri.pod-annotations": true}

var _ Editor = CNI{}

func (c CNI) typ() string {
	if c.Type == "" {
		return DefaultCNIType
	}
	return c.Type
}

// entry is kl's plugin entry: "type" first, then the other keys in sorted order.
func (c CNI) entry() (orderedObject, error) {
	o := orderedObject{{"type", c.typ()}}
	keys := make([]string, 0, len(c.Conf))
	for k := range c.Conf {
		if k == "type" {
			return nil, fmt.Errorf("kl's CNI entry: %q is set by Type", k)
		}
		keys = append(keys, k)
	}
	if _, ok := c.Conf["capabilities"]; !ok {
		keys = append(keys, "capabilities")
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, ok := c.Conf[k]
		if !ok {
			v = DefaultCNICapabilities
		}
		o = append(o, kv{k, v})
	}
	return o, nil
}

// errSinglePlugin is conflist's error for a single-plugin network configuration (a
// .conf: an object with a "type" and no "plugins" list).
var errSinglePlugin = errors.New(`a single-plugin network configuration (no "plugins" list) cannot chain kl-cni; convert it to a .conflist`)

// conflist locates the plugins array of a conflist and kl's entries in it.
func (c CNI) conflist(data []byte) (root, plugins *span, kl []int, err error) {
	root, err = parseSpans(data)
	if err != nil {
		return nil, nil, nil, err
	}
	if root.Kind != '{' {
		return nil, nil, nil, errors.New("not a CNI configuration: the top level is not an object")
	}
	plugins = root.get("plugins")
	if plugins == nil {
		if root.get("type") != nil {
			return nil, nil, nil, errSinglePlugin
		}
		return nil, nil, nil, errors.New(`not a CNI configuration list: no "plugins" list`)
	}
	if plugins.Kind != '[' {
		return nil, nil, nil, errors.New(`"plugins" is not a list`)
	}
	for i, p := range plugins.Elems {
		if p.Kind != '{' {
			return nil, nil, nil, fmt.Errorf("plugins[%d] is not an object", i)
		}
		if t := p.get("type"); t != nil && t.Kind == '"' {
			var s string
			if err := json.Unmarshal(data[t.Start:t.End], &s); err == nil && s == c.typ() {
				kl = append(kl, i)
			}
		}
	}
	return root, plugins, kl, nil
}

// Install appends kl's entry to the plugins list. kl owns only "type", "capabilities"
// and the keys of Conf there: when kl's entry is already the last plugin, only those
// are corrected, in place, and the operator's other settings of it (redirectPort, mark,
// excludeCIDRs… set by an earlier --conf or by hand) stay, so installing again without
// Conf changes nothing. An entry elsewhere in the list (or several) is moved to the
// end: the last of them, with kl's keys corrected, takes the place of all.
func (c CNI) Install(old []byte) ([]byte, error) {
	if len(strings.TrimSpace(string(old))) == 0 {
		return nil, errors.New("no CNI configuration to chain kl-cni to (the file is empty)")
	}
	want, err := c.entry()
	if err != nil {
		return nil, err
	}
	root, plugins, kl, err := c.conflist(old)
	if err != nil {
		return nil, err
	}
	if c.Versions != nil {
		var v string
		if cv := root.get("cniVersion"); cv != nil {
			_ = json.Unmarshal(old[cv.Start:cv.End], &v)
		}
		if !slices.Contains(c.Versions, v) {
			return nil, fmt.Errorf("the network's cniVersion is %q but %s supports %s: chaining it would fail every pod's setup", v, c.typ(), strings.Join(c.Versions, ", "))
		}
	}
	// What kl's entry must be after the edit: the operator's entry (the last kl one),
	// with kl's keys set.
	var cur *span
	if len(kl) > 0 {
		cur = plugins.Elems[kl[len(kl)-1]]
	}
	expect, err := c.expected(old, cur, want)
	if err != nil {
		return nil, err
	}
	var next []byte
	switch {
	case len(kl) == 1 && kl[0] == len(plugins.Elems)-1:
		if next, err = c.correct(old, want); err != nil {
			return nil, err
		}
		if bytes.Equal(next, old) {
			return old, nil
		}
	default:
		entry := want
		if cur != nil {
			entry = merged(old, cur, want)
		}
		base := old
		if len(kl) > 0 {
			if base, err = c.Uninstall(old); err != nil {
				return nil, err
			}
		}
		root, plugins, _, err = c.conflist(base)
		if err != nil {
			return nil, err
		}
		unit := indentUnit(base, root)
		starts, ends := entries(plugins)
		next, err = insertLast(base, plugins, starts, ends, unit, func(ind string, multi bool) (string, error) {
			return render(entry, ind, unit, multi)
		})
		if err != nil {
			return nil, err
		}
	}
	if err := c.check(old, next, expect); err != nil {
		return nil, err
	}
	return next, nil
}

// correct sets kl's keys (want, but "type", which identifies the entry) in kl's entry,
// the last plugin of data, one by one where they are: a missing key is added as the
// entry's last, a wrong value replaced, written the way the entry is.
func (c CNI) correct(data []byte, want orderedObject) ([]byte, error) {
	for _, m := range want[1:] {
		root, plugins, kl, err := c.conflist(data)
		if err != nil {
			return nil, err
		}
		e := plugins.Elems[kl[len(kl)-1]]
		switch v := e.get(m.K); {
		case v == nil:
			data, err = addMember(data, e, m.K, m.V)
		case !sameJSON(data[v.Start:v.End], m.V):
			data, err = replaceIn(data, root, e, v, m.V)
		}
		if err != nil {
			return nil, err
		}
	}
	return data, nil
}

// merged is the entry e of data, with its keys in their order and their values as
// written, and want's keys set: in place when e has them, after its own otherwise. A key
// e repeats appears once, with the value that is read (the last).
func merged(data []byte, e *span, want orderedObject) orderedObject {
	var o orderedObject
	at := map[string]int{}
	set := func(k string, v any) {
		if i, ok := at[k]; ok {
			o[i].V = v
			return
		}
		at[k] = len(o)
		o = append(o, kv{k, v})
	}
	for _, m := range e.Members {
		set(m.Key, json.RawMessage(data[m.Value.Start:m.Value.End]))
	}
	for _, m := range want {
		set(m.K, m.V)
	}
	return o
}

// expected is kl's entry as an install must leave it, decoded: e (the current one; nil
// when there is none) with want's keys set.
func (c CNI) expected(data []byte, e *span, want orderedObject) (map[string]any, error) {
	m := map[string]any{}
	if e != nil {
		if err := json.Unmarshal(data[e.Start:e.End], &m); err != nil {
			return nil, fmt.Errorf("kl's entry: %w", err)
		}
	}
	for _, x := range want {
		raw, err := marshalNoEscape(x.V)
		if err != nil {
			return nil, fmt.Errorf("kl's entry: key %q: %w", x.K, err)
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("kl's entry: key %q: %w", x.K, err)
		}
		m[x.K] = v
	}
	return m, nil
}

// Uninstall removes every kl entry from the plugins list.
func (c CNI) Uninstall(old []byte) ([]byte, error) {
	if len(strings.TrimSpace(string(old))) == 0 {
		return old, nil
	}
	next := old
	for {
		_, plugins, kl, err := c.conflist(next)
		if errors.Is(err, errSinglePlugin) {
			// A single-plugin .conf cannot chain anything, so kl is never in one:
			// nothing to take out (Install refuses such a file).
			return old, nil
		}
		if err != nil {
			return nil, err
		}
		if len(kl) == 0 {
			break
		}
		starts, ends := entries(plugins)
		next = removeEntry(next, starts, ends, kl[len(kl)-1])
	}
	if err := c.check(old, next, nil); err != nil {
		return nil, err
	}
	return next, nil
}

// check proves an edit changed nothing but kl's entries: the two documents, with kl's
// entries taken out, decode to the same value. After an install (want, the entry as it
// must be, decoded) the last plugin is kl's and is want: kl's keys set, the operator's
// kept.
func (c CNI) check(before, after []byte, want map[string]any) error {
	var a, b map[string]any
	if err := json.Unmarshal(before, &a); err != nil {
		return fmt.Errorf("re-read original: %w", err)
	}
	if err := json.Unmarshal(after, &b); err != nil {
		return fmt.Errorf("edit produced invalid JSON (a bug): %w", err)
	}
	strip := func(m map[string]any) (last map[string]any) {
		ps, _ := m["plugins"].([]any)
		kept := ps[:0:0]
		for i, p := range ps {
			pm, _ := p.(map[string]any)
			if pm["type"] == c.typ() {
				if i == len(ps)-1 {
					last = pm
				}
				continue
			}
			kept = append(kept, p)
		}
		m["plugins"] = kept
		return last
	}
	strip(a)
	last := strip(b)
	if !reflect.DeepEqual(a, b) {
		return errors.New("edit would change more than kl's plugin entry (a bug); nothing written")
	}
	switch {
	case want != nil && last == nil:
		return errors.New("kl-cni is not the last plugin after the edit (a bug); nothing written")
	case want != nil && !reflect.DeepEqual(last, want):
		return fmt.Errorf("kl's entry after the edit is %v, want %v (a bug); nothing written", last, want)
	}
	return nil
}

// ErrNotChained is what Check's error wraps when the network configuration runtimes use
// does not chain kl-cni as kl would: pods created now would start without kl's capture.
var ErrNotChained = errors.New("kl-cni is not chained")

// Check reports whether the network configuration data (of the file path) chains
// kl-cni as Install would leave it: kl's entry the last plugin, with kl's keys, in a
// network whose cniVersion c.Versions holds. It changes nothing; the error, which wraps
// ErrNotChained, says what is missing. On success it returns how many plugins the
// network has.
func (c CNI) Check(data []byte) (plugins int, err error) {
	if len(strings.TrimSpace(string(data))) == 0 {
		return 0, fmt.Errorf("%w: the file is empty", ErrNotChained)
	}
	_, ps, kl, err := c.conflist(data)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrNotChained, err)
	}
	next, err := c.Install(data)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%w: %w", ErrNotChained, err)
	case len(kl) == 0:
		return 0, fmt.Errorf("%w: no %s entry in its plugins", ErrNotChained, c.typ())
	case kl[len(kl)-1] != len(ps.Elems)-1 || len(kl) > 1:
		return 0, fmt.Errorf("%w: %s is not the last plugin, or is in the list more than once", ErrNotChained, c.typ())
	case !bytes.Equal(next, data):
		return 0, fmt.Errorf("%w: %s's entry lacks kl's settings (capabilities or --conf)", ErrNotChained, c.typ())
	}
	return len(ps.Elems), nil
}

// FindCNIConfig returns the network configuration a CNI runtime uses in dir: the first
// .conf, .conflist or .json file in lexical order, as libcni, containerd and CRI-O pick
// it.
func FindCNIConfig(dir string) (string, error) {
	paths, err := CNIConfigs(dir)
	if err != nil {
		return "", err
	}
	return paths[0], nil
}

// CNIConfigs returns every network configuration file in dir (.conf, .conflist and
// .json), in lexical order, the first being the one runtimes use. It is an error when
// there is none.
func CNIConfigs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read CNI configuration directory: %w", err)
	}
	var paths []string
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		switch filepath.Ext(e.Name()) {
		case ".conf", ".conflist", ".json":
			paths = append(paths, filepath.Join(dir, e.Name()))
		}
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no CNI network configuration in %s (is the cluster's network plugin installed?)", dir)
	}
	sort.Strings(paths)
	return paths, nil
}

// UninstallCNIDir takes kl's entry out of every network configuration in dir, not only
// the one runtimes use now: the network plugin may have renamed its file, or kl may have
// been chained into another one by --cni-conf-file. It goes on past a file it cannot
// edit, and returns one Change per file it edited or found without kl, in name order,
// with the errors of the others joined. o.Uninstall is implied.
func UninstallCNIDir(dir string, c CNI, o Options) ([]Change, error) {
	paths, err := CNIConfigs(dir)
	if err != nil {
		return nil, err
	}
	o.Uninstall = true
	var (
		chs  []Change
		errs []error
	)
	for _, p := range paths {
		ch, err := Apply(p, c, o)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		chs = append(chs, ch)
	}
	return chs, errors.Join(errs...)
}

// sameJSON reports whether raw decodes to the same value as v.
func sameJSON(raw []byte, v any) bool {
	var a, b any
	if json.Unmarshal(raw, &a) != nil {
		return false
	}
	enc, err := json.Marshal(v)
	if err != nil || json.Unmarshal(enc, &b) != nil {
		return false
	}
	return reflect.DeepEqual(a, b)
}

// orderedObject is a JSON object that keeps its keys in the order given.
type orderedObject []kv

type kv struct {
	K string
	V any
}

func (o orderedObject) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, e := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(e.K)
		if err != nil {
			return nil, err
		}
		v, err := marshalNoEscape(e.V)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", e.K, err)
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

func marshalNoEscape(v any) ([]byte, error) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return []byte(strings.TrimSuffix(b.String(), "\n")), nil
}

// PluginVersions runs a CNI plugin's VERSION command (CNI_COMMAND=VERSION) and returns
// the spec versions it reports supporting.
func PluginVersions(ctx context.Context, binary string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary)
	cmd.Env = []string{"CNI_COMMAND=VERSION", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.0.0"}`)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s VERSION: %w: %s", binary, err, strings.TrimSpace(errb.String()))
	}
	var v struct {
		SupportedVersions []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || len(v.SupportedVersions) == 0 {
		return nil, fmt.Errorf("%s VERSION printed %q, not a CNI version answer", binary, out.String())
	}
	return v.SupportedVersions, nil
}
