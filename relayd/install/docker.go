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
// records nothing else there.
func (d Docker) Install(old []byte) ([]byte, error) {
	data := old
	if len(strings.TrimSpace(string(data))) == 0 {
		data = []byte("{}\n")
	}
	root, err := parseSpans(data)
	if err != nil {
		return nil, err
	}
	if root.Kind != '{' {
		return nil, errors.New("daemon.json: the top level is not an object")
	}
	want := orderedObject{{"path", d.path()}}
	next := data
	rts := lastValue(root, "runtimes")
	switch {
	case rts == nil:
		next, err = addMember(next, root, "runtimes", orderedObject{{d.name(), want}})
	case rts.Kind != '{':
		return nil, errors.New(`daemon.json: "runtimes" is not an object`)
	default:
		cur := lastValue(rts, d.name())
		switch {
		case cur == nil:
			next, err = addMember(next, rts, d.name(), want)
		case cur.Kind != '{':
			// Not a runtime definition at all: kl's takes its place.
			next, err = replaceValue(next, root, cur, want)
		default:
			// kl's runtime is there: correct only the key kl owns, in place; the
			// operator's own keys (runtimeArgs…) and their order stay.
			p := lastValue(cur, "path")
			switch {
			case p == nil:
				next, err = addMember(next, cur, "path", d.path())
			case !sameJSON(data[p.Start:p.End], d.path()):
				next, err = replaceValue(next, root, p, d.path())
			}
		}
	}
	if err != nil {
		return nil, err
	}
	if d.Default {
		if next, err = d.setDefault(next); err != nil {
			return nil, err
		}
	}
	if err := d.check(data, next, true); err != nil {
		return nil, err
	}
	if len(strings.TrimSpace(string(old))) == 0 && string(next) == string(data) {
		return old, nil
	}
	return next, nil
}

func (d Docker) setDefault(data []byte) ([]byte, error) {
	root, err := parseSpans(data)
	if err != nil {
		return nil, err
	}
	cur := root.get("default-runtime")
	if cur != nil {
		var s string
		if err := json.Unmarshal(data[cur.Start:cur.End], &s); err != nil {
			return nil, errors.New(`daemon.json: "default-runtime" is not a string`)
		}
		switch s {
		case d.name():
			return data, nil
		case "runc", "":
			data = removeMember(data, root, "default-runtime")
			if root, err = parseSpans(data); err != nil {
				return nil, err
			}
		default:
			// kl-runtime execs runc; taking over another default runtime (nvidia, crun,
			// kata) would silently change how every container runs.
			return nil, fmt.Errorf(`daemon.json: "default-runtime" is %q; kl would replace it (set it to "runc" or remove it first)`, s)
		}
	}
	return addMember(data, root, "default-runtime", d.name())
}

// Uninstall removes runtimes.<name> (and "runtimes" when that leaves it empty), whatever
// else the operator put in it, and default-runtime when it names kl.
func (d Docker) Uninstall(old []byte) ([]byte, error) {
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
			next = removeMember(next, root, "default-runtime")
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
			if len(rts.Members) == 1 {
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

// notes tells what an uninstall changed beyond kl's runtime.
func (d Docker) notes(old, next []byte, uninstall bool) []string {
	var a, b map[string]any
	if !uninstall || json.Unmarshal(old, &a) != nil || json.Unmarshal(next, &b) != nil {
		return nil
	}
	if _, still := b["default-runtime"]; a["default-runtime"] == d.name() && !still {
		return []string{fmt.Sprintf(`"default-runtime" was %q; removed, so dockerd runs containers with runc again`, d.name())}
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
		if m["default-runtime"] == d.name() || m["default-runtime"] == "runc" {
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

// lastValue returns the value of an object's member key, the last one when the key is
// repeated (as encoding/json, and so dockerd, reads it), or nil.
func lastValue(obj *span, key string) *span {
	var v *span
	for _, m := range obj.Members {
		if m.Key == key {
			v = m.Value
		}
	}
	return v
}

// replaceValue returns data with the value v replaced by value, written the way the
// file is (multi-line with the indentation of v's line when v starts a multi-line
// value's line, compact otherwise).
func replaceValue(data []byte, root, v *span, value any) ([]byte, error) {
	// The indentation of the line v starts on (its member's).
	i := bytes.LastIndexByte(data[:v.Start], '\n') + 1
	j := i
	for j < v.Start && (data[j] == ' ' || data[j] == '\t') {
		j++
	}
	ind := string(data[i:j])
	multi := bytes.IndexByte(data[root.Start:root.End], '\n') >= 0
	text, err := render(value, ind, indentUnit(data, root), multi)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(data)+len(text))
	out = append(out, data[:v.Start]...)
	out = append(out, text...)
	return append(out, data[v.End:]...), nil
}

// removeMember takes member key out of object obj.
func removeMember(data []byte, obj *span, key string) []byte {
	starts, ends := entries(obj)
	for i, m := range obj.Members {
		if m.Key == key {
			return removeEntry(data, starts, ends, i)
		}
	}
	return data
}
