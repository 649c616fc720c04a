package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
)

// Docker registers kl-runtime as a runtime of dockerd (daemon.json "runtimes"), so
// `docker run --runtime kl` (or every container, with Default) goes through it.
type Docker struct {
	Name    string // runtime name; DefaultRuntimeName when ""
	Path    string // the wrapper binary; DefaultRuntimeBinary when ""
	Default bool   // also make it dockerd's "default-runtime"
}

var _ Editor = Docker{}

func (d Docker) name() string { return or(d.Name, DefaultRuntimeName) }
func (d Docker) path() string { return or(d.Path, DefaultRuntimeBinary) }

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Install adds runtimes.<name> = {"path": …} (and default-runtime), keeping every other
// key and its position. When kl's runtime is already there, only its "path" is
// corrected, in place: the operator's other keys in it (runtimeArgs…) stay, as the
// containerd editor keeps theirs. dockerd rejects unknown keys in daemon.json, so kl
// records nothing else there: what default-runtime was before kl took it, Apply keeps
// in StatePath (see editDefault).
func (d Docker) Install(old []byte) ([]byte, error) {
	next, _, err := d.install(old)
	return next, err
}

// install is Install that also returns the default-runtime it replaced (prior), when it
// made kl's runtime the default.
func (d Docker) install(old []byte) (next []byte, prior *defaultState, err error) {
	data := old
	if len(strings.TrimSpace(string(data))) == 0 {
		data = []byte("{}\n")
	}
	root, err := parseSpans(data)
	if err != nil {
		return nil, nil, err
	}
	if root.Kind != '{' {
		return nil, nil, errors.New("daemon.json: the top level is not an object")
	}
	want := orderedObject{{"path", d.path()}}
	next = data
	rts := root.get("runtimes")
	switch {
	case rts == nil:
		next, err = addMember(next, root, "runtimes", orderedObject{{d.name(), want}})
	case rts.Kind != '{':
		return nil, nil, errors.New(`daemon.json: "runtimes" is not an object`)
	default:
		cur := rts.get(d.name())
		switch {
		case cur == nil:
			next, err = addMember(next, rts, d.name(), want)
		case cur.Kind != '{':
			// Not a runtime definition at all: kl's takes its place.
			next, err = replaceValue(next, root, cur, want)
		default:
			// kl's runtime is there: correct only the key kl owns, in place; the
			// operator's own keys (runtimeArgs…) and their order stay.
			p := cur.get("path")
			switch {
			case p == nil:
				next, err = addMember(next, cur, "path", d.path())
			case !sameJSON(data[p.Start:p.End], d.path()):
				next, err = replaceValue(next, root, p, d.path())
			}
		}
	}
	if err != nil {
		return nil, nil, err
	}
	if d.Default {
		if next, prior, err = d.setDefault(next); err != nil {
			return nil, nil, err
		}
	}
	if err := d.check(data, next, true); err != nil {
		return nil, nil, err
	}
	if len(strings.TrimSpace(string(old))) == 0 && string(next) == string(data) {
		return old, prior, nil
	}
	return next, prior, nil
}

// setDefault makes kl's runtime dockerd's default-runtime: in place of a "runc" (or
// empty) one, which it returns as prior, or as a new last member, returning an empty
// prior. prior is nil when kl's runtime already was the default.
func (d Docker) setDefault(data []byte) ([]byte, *defaultState, error) {
	root, err := parseSpans(data)
	if err != nil {
		return nil, nil, err
	}
	cur := root.get("default-runtime")
	if cur == nil {
		next, err := addMember(data, root, "default-runtime", d.name())
		return next, &defaultState{Runtime: d.name()}, err
	}
	var s string
	if err := json.Unmarshal(data[cur.Start:cur.End], &s); err != nil {
		return nil, nil, errors.New(`daemon.json: "default-runtime" is not a string`)
	}
	switch s {
	case d.name():
		return data, nil, nil
	case "runc", "":
		next, err := replaceValue(data, root, cur, d.name())
		return next, &defaultState{Runtime: d.name(), DefaultRuntime: &s}, err
	default:
		// kl-runtime execs runc; taking over another default runtime (nvidia, crun,
		// kata) would silently change how every container runs.
		return nil, nil, fmt.Errorf(`daemon.json: "default-runtime" is %q; kl would replace it (set it to "runc" or remove it first)`, s)
	}
}

var _ defaultEditor = Docker{}

// currentDefault is daemon.json's "default-runtime", "" when it has none.
func (d Docker) currentDefault(data []byte) string {
	var m struct {
		Default string `json:"default-runtime"`
	}
	json.Unmarshal(data, &m)
	return m.Default
}

// Uninstall removes runtimes.<name> (and "runtimes" when that leaves it empty), whatever
// else the operator put in it, and default-runtime when it names kl. (Apply also puts
// back the default-runtime that install replaced, and leaves a "runtimes" that was
// there empty before install; see editDefault.)
func (d Docker) Uninstall(old []byte) ([]byte, error) {
	return d.uninstall(old, nil)
}

// uninstall is Uninstall that, when default-runtime names kl's runtime and st records
// what it was before, puts that back, in place; and when st records that "runtimes" was
// there, empty, before install, leaves it so.
func (d Docker) uninstall(old []byte, st *defaultState) ([]byte, error) {
	if len(strings.TrimSpace(string(old))) == 0 {
		return old, nil
	}
	root, err := parseSpans(old)
	if err != nil {
		return nil, err
	}
	if root.Kind != '{' {
		return nil, errors.New("daemon.json: the top level is not an object")
	}
	next := old
	if cur := root.get("default-runtime"); cur != nil {
		var s string
		if json.Unmarshal(old[cur.Start:cur.End], &s) == nil && s == d.name() {
			if st != nil && st.DefaultRuntime != nil {
				next, err = replaceValue(next, root, cur, *st.DefaultRuntime)
			} else {
				next = removeMember(next, root, "default-runtime")
			}
			if err != nil {
				return nil, err
			}
			if root, err = parseSpans(next); err != nil {
				return nil, err
			}
		}
	}
	// Every definition under kl's name, also a repeated one (encoding/json, as dockerd,
	// takes the last).
	for removed := true; removed; {
		removed = false
		for i, m := range root.Members {
			rts := m.Value
			if m.Key != "runtimes" || rts.Kind != '{' || rts.get(d.name()) == nil {
				continue
			}
			if len(rts.Members) == 1 && (st == nil || !st.EmptyRuntimes) {
				starts, ends := entries(root)
				next = removeEntry(next, starts, ends, i)
			} else {
				next = removeMember(next, rts, d.name())
			}
			if root, err = parseSpans(next); err != nil {
				return nil, err
			}
			removed = true
			break
		}
	}
	if err := d.check(old, next, false); err != nil {
		return nil, err
	}
	return next, nil
}

// hasRuntime reports whether daemon.json defines kl's runtime.
func (d Docker) hasRuntime(data []byte) bool {
	var m struct {
		Runtimes map[string]any `json:"runtimes"`
	}
	json.Unmarshal(data, &m)
	_, ok := m.Runtimes[d.name()]
	return ok
}

// emptyRuntimes reports whether daemon.json has a "runtimes" object with nothing in it.
func (d Docker) emptyRuntimes(data []byte) bool {
	root, err := parseSpans(data)
	if err != nil || root.Kind != '{' {
		return false
	}
	rts := root.get("runtimes")
	return rts != nil && rts.Kind == '{' && len(rts.Members) == 0
}

// blank reports whether data is the empty object install writes a daemon.json it
// creates with.
func (d Docker) blank(data []byte) bool {
	return string(bytes.TrimSpace(data)) == "{}"
}

// notes tells what an edit changed beyond kl's runtime: dockerd's default runtime.
func (d Docker) notes(old, next []byte, uninstall bool, _ *defaultState) []string {
	var a, b map[string]any
	if json.Unmarshal(old, &a) != nil || json.Unmarshal(next, &b) != nil {
		return nil
	}
	was, had := a["default-runtime"]
	now, has := b["default-runtime"]
	switch {
	case uninstall && was == d.name() && !has:
		return []string{fmt.Sprintf(`"default-runtime" was %q; removed, so dockerd runs containers with runc again`, d.name())}
	case uninstall && was == d.name() && now != d.name():
		return []string{fmt.Sprintf(`"default-runtime" was %q; set back to %q, as it was before kl was installed`, d.name(), now)}
	case !uninstall && now == d.name() && !had:
		return []string{fmt.Sprintf(`"default-runtime" set to %q; uninstall removes it again`, d.name())}
	case !uninstall && now == d.name() && was != d.name():
		return []string{fmt.Sprintf(`"default-runtime" was %q; set to %q, and uninstall sets it back`, was, d.name())}
	}
	return nil
}

// check proves that only kl's keys differ between the two documents. After an install
// (installed) kl's runtime must have kl's path, and the operator's other keys in it must
// be what they were; after an uninstall it must be gone.
func (d Docker) check(before, after []byte, installed bool) error {
	var a, b map[string]any
	if err := json.Unmarshal(before, &a); err != nil {
		return fmt.Errorf("re-read original: %w", err)
	}
	if err := json.Unmarshal(after, &b); err != nil {
		return fmt.Errorf("edit produced invalid JSON (a bug): %w", err)
	}
	rts, _ := b["runtimes"].(map[string]any)
	kl, ok := rts[d.name()]
	switch klm, _ := kl.(map[string]any); {
	case installed && klm["path"] != d.path():
		return fmt.Errorf("runtime %q after the edit is %v, without kl's path (defined twice?); nothing written", d.name(), kl)
	case !installed && ok:
		return fmt.Errorf("runtime %q is still defined after the edit (defined twice?); nothing written", d.name())
	case !installed && b["default-runtime"] == d.name():
		return fmt.Errorf(`"default-runtime" still names %q after the edit (a bug); nothing written`, d.name())
	}
	for _, m := range []map[string]any{a, b} {
		if rts, ok := m["runtimes"].(map[string]any); ok {
			// What is left of kl's runtime without kl's own key is the operator's.
			kl, ok := rts[d.name()].(map[string]any)
			if kl = maps.Clone(kl); ok && installed {
				delete(kl, "path")
			}
			if installed && len(kl) > 0 {
				rts[d.name()] = kl
			} else {
				delete(rts, d.name())
			}
			if len(rts) == 0 {
				delete(m, "runtimes")
			}
		}
		if m["default-runtime"] == d.name() || m["default-runtime"] == "runc" || m["default-runtime"] == "" {
			delete(m, "default-runtime")
		}
	}
	if !reflect.DeepEqual(a, b) {
		return errors.New("edit would change more than kl's runtime (a bug); nothing written")
	}
	return nil
}

// addMember appends "key": value as the last member of object obj.
func addMember(data []byte, obj *span, key string, value any) ([]byte, error) {
	root, err := parseSpans(data)
	if err != nil {
		return nil, err
	}
	unit := indentUnit(data, root)
	starts, ends := entries(obj)
	k, err := json.Marshal(key)
	if err != nil {
		return nil, err
	}
	return insertLast(data, obj, starts, ends, unit, func(ind string, multi bool) (string, error) {
		v, err := render(value, ind, unit, multi)
		if err != nil {
			return "", err
		}
		return string(k) + ": " + v, nil
	})
}

// replaceValue returns data with the value v replaced by value, written the way the
// file is (multi-line with the indentation of v's line when v starts a multi-line
// value's line, compact otherwise).
func replaceValue(data []byte, root, v *span, value any) ([]byte, error) {
	return replaceIn(data, root, root, v, value)
}

// replaceIn is replaceValue for a value v of the container scope: value is written
// multi-line when scope spans several lines, compact otherwise, with the indent unit
// of the document root.
func replaceIn(data []byte, root, scope, v *span, value any) ([]byte, error) {
	// The indentation of the line v starts on (its member's).
	i := bytes.LastIndexByte(data[:v.Start], '\n') + 1
	j := i
	for j < v.Start && (data[j] == ' ' || data[j] == '\t') {
		j++
	}
	ind := string(data[i:j])
	multi := bytes.IndexByte(data[scope.Start:scope.End], '\n') >= 0
	text, err := render(value, ind, indentUnit(data, root), multi)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(data)+len(text))
	out = append(out, data[:v.Start]...)
	out = append(out, text...)
	return append(out, data[v.End:]...), nil
}

// removeMember takes member key out of object obj: the last one when the key is
// repeated, the one get (and dockerd) reads.
func removeMember(data []byte, obj *span, key string) []byte {
	starts, ends := entries(obj)
	for i := len(obj.Members) - 1; i >= 0; i-- {
		if obj.Members[i].Key == key {
			return removeEntry(data, starts, ends, i)
		}
	}
	return data
}
