package install

import (
	"encoding/json"
	"errors"
	"fmt"
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
// key and its position. dockerd rejects unknown keys in daemon.json, so kl records
// nothing else there.
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
	rts := root.get("runtimes")
	switch {
	case rts == nil:
		next, err = addMember(next, root, "runtimes", orderedObject{{d.name(), want}})
	case rts.Kind != '{':
		return nil, errors.New(`daemon.json: "runtimes" is not an object`)
	default:
		cur := rts.get(d.name())
		if cur != nil && sameJSON(data[cur.Start:cur.End], want) {
			break
		}
		if cur != nil {
			// Another definition under kl's name: replace it.
			next = removeMember(next, rts, d.name())
			if root, err = parseSpans(next); err != nil {
				return nil, err
			}
			rts = root.get("runtimes")
		}
		next, err = addMember(next, rts, d.name(), want)
	}
	if err != nil {
		return nil, err
	}
	if d.Default {
		if next, err = d.setDefault(next); err != nil {
			return nil, err
		}
	}
	if err := d.check(data, next); err != nil {
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

// Uninstall removes runtimes.<name> (and "runtimes" when that leaves it empty), and
// default-runtime when it names kl.
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
	if rts := root.get("runtimes"); rts != nil && rts.Kind == '{' && rts.get(d.name()) != nil {
		if len(rts.Members) == 1 {
			next = removeMember(next, root, "runtimes")
		} else {
			next = removeMember(next, rts, d.name())
		}
	}
	if err := d.check(old, next); err != nil {
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

// check proves that only kl's keys differ between the two documents.
func (d Docker) check(before, after []byte) error {
	var a, b map[string]any
	if err := json.Unmarshal(before, &a); err != nil {
		return fmt.Errorf("re-read original: %w", err)
	}
	if err := json.Unmarshal(after, &b); err != nil {
		return fmt.Errorf("edit produced invalid JSON (a bug): %w", err)
	}
	for _, m := range []map[string]any{a, b} {
		if rts, ok := m["runtimes"].(map[string]any); ok {
			delete(rts, d.name())
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
