// Package oci reads, edits and atomically rewrites an OCI bundle's config.json, and the
// process file of `runc exec --process`.
//
// The spec is kept as generic JSON: every field kl does not model (and every field of a
// future runtime-spec version) survives an edit unchanged, numbers included. Edits are
// small Modifiers, one per concern (environment, mounts, hooks), each safe to apply twice.
// This package does not decide what to inject; shim/runtime does.
package oci

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kl-egress/kl/atomicfile"
)

// ConfigName is the spec file inside a bundle.
const ConfigName = "config.json"

// maxSpecBytes bounds what Load reads: a real spec is kilobytes.
const maxSpecBytes = 64 << 20

// ErrMalformed marks a config.json that is not a usable OCI spec.
var ErrMalformed = errors.New("malformed OCI spec")

// Spec is an OCI runtime spec held as generic JSON.
type Spec struct {
	doc map[string]any
	// processOnly marks a process file (`runc exec --process FILE`): one OCI process
	// object, held as the spec {"process": …} so the same modifiers edit it, and written
	// back as the object alone.
	processOnly bool
}

// Parse decodes a spec. name is used in errors only.
func Parse(name string, data []byte) (*Spec, error) {
	doc, err := decodeObject(name, data, "top level")
	if err != nil {
		return nil, err
	}
	s := &Spec{doc: doc}
	// Check the parts kl edits now, so a bad spec fails before anything is written.
	for _, key := range []string{"process", "hooks", "annotations", "linux"} {
		if x, ok := doc[key]; ok && x != nil {
			if _, ok := x.(map[string]any); !ok {
				return nil, fmt.Errorf("%s: %w: %q is %s, not an object", name, ErrMalformed, key, kind(x))
			}
		}
	}
	if x, ok := doc["mounts"]; ok && x != nil {
		if _, ok := x.([]any); !ok {
			return nil, fmt.Errorf("%s: %w: \"mounts\" is %s, not an array", name, ErrMalformed, kind(x))
		}
	}
	if _, err := s.Annotations(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if _, err := s.Env(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return s, nil
}

// ParseProcess decodes a process file, the OCI process object that `runc exec --process`
// reads. The result is edited like a spec (its "process" is the file's object) and
// written back as the object alone. name is used in errors only.
func ParseProcess(name string, data []byte) (*Spec, error) {
	proc, err := decodeObject(name, data, "process")
	if err != nil {
		return nil, err
	}
	s := &Spec{doc: map[string]any{"process": proc}, processOnly: true}
	if _, err := s.Env(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return s, nil
}

// decodeObject decodes data, which must hold exactly one JSON object (what names it in
// errors), keeping numbers as written.
func decodeObject(name string, data []byte, what string) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // keep 64-bit ids and unusual numbers exactly as written
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", name, ErrMalformed, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%s: %w: trailing data after the JSON object", name, ErrMalformed)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: %w: %s is %s, not an object", name, ErrMalformed, what, kind(v))
	}
	return obj, nil
}

// Load reads bundle/config.json.
func Load(bundle string) (*Spec, error) { return LoadFile(filepath.Join(bundle, ConfigName)) }

// LoadFile reads a spec from path.
func LoadFile(p string) (*Spec, error) {
	data, err := readFile(p)
	if err != nil {
		return nil, err
	}
	return Parse(p, data)
}

// LoadProcessFile reads a process file (ParseProcess) from path.
func LoadProcessFile(p string) (*Spec, error) {
	data, err := readFile(p)
	if err != nil {
		return nil, err
	}
	return ParseProcess(p, data)
}

func readFile(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("read OCI spec: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSpecBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read OCI spec %s: %w", p, err)
	}
	if len(data) > maxSpecBytes {
		return nil, fmt.Errorf("%s: %w: larger than %d bytes", p, ErrMalformed, maxSpecBytes)
	}
	return data, nil
}

// Marshal encodes the spec (indented, without HTML escaping); a process file encodes as
// its process object.
func (s *Spec) Marshal() ([]byte, error) {
	var v any = s.doc
	if s.processOnly {
		v = s.doc["process"]
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "\t")
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encode OCI spec: %w", err)
	}
	return b.Bytes(), nil
}

// Save writes the spec to bundle/config.json atomically: a temporary file in the same
// directory, synced, then renamed over the old one with the old file's owner and
// permissions. A symlink is written through: the file it resolves to is replaced, in
// that file's directory, and the link stays. A failure leaves the old file as it was.
func (s *Spec) Save(bundle string) error { return s.SaveFile(filepath.Join(bundle, ConfigName)) }

// SaveFile writes the spec to path atomically, like Save.
func (s *Spec) SaveFile(p string) error {
	data, err := s.Marshal()
	if err != nil {
		return err
	}
	if fi, err := os.Lstat(p); err == nil && fi.Mode().Type() == os.ModeSymlink {
		target, err := filepath.EvalSymlinks(p)
		if err != nil {
			return fmt.Errorf("write OCI spec %s: resolve symlink: %w", p, err)
		}
		p = target
	}
	mode := os.FileMode(0o644)
	old, err := os.Stat(p)
	if err == nil {
		mode = old.Mode().Perm()
	}
	if err := atomicfile.Write(p, data, mode, old); err != nil {
		return fmt.Errorf("write OCI spec %s: %w", p, err)
	}
	return nil
}

// Annotations returns the spec's annotations (nil when there are none).
func (s *Spec) Annotations() (map[string]string, error) {
	raw, ok := s.doc["annotations"].(map[string]any)
	if !ok {
		return nil, nil
	}
	out := make(map[string]string, len(raw))
	for k, v := range raw {
		str, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("%w: annotation %q is %s, not a string", ErrMalformed, k, kind(v))
		}
		out[k] = str
	}
	return out, nil
}

// Env returns process.env.
func (s *Spec) Env() ([]string, error) {
	proc, ok := s.doc["process"].(map[string]any)
	if !ok {
		return nil, nil
	}
	raw, ok := proc["env"]
	if !ok || raw == nil {
		return nil, nil
	}
	list, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: process.env is %s, not an array", ErrMalformed, kind(raw))
	}
	out := make([]string, len(list))
	for i, v := range list {
		str, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("%w: process.env[%d] is %s, not a string", ErrMalformed, i, kind(v))
		}
		out[i] = str
	}
	return out, nil
}

func (s *Spec) setEnv(env []string) error {
	proc, ok := s.doc["process"].(map[string]any)
	if !ok {
		return fmt.Errorf("%w: no process object to set environment variables in", ErrMalformed)
	}
	list := make([]any, len(env))
	for i, e := range env {
		list[i] = e
	}
	proc["env"] = list
	return nil
}

// HasNamespace reports whether linux.namespaces lists typ, and the path it joins ("" for
// a new namespace).
func (s *Spec) HasNamespace(typ string) (found bool, path string) {
	linux, _ := s.doc["linux"].(map[string]any)
	nss, _ := linux["namespaces"].([]any)
	for _, n := range nss {
		m, _ := n.(map[string]any)
		if t, _ := m["type"].(string); t == typ {
			p, _ := m["path"].(string)
			return true, p
		}
	}
	return false, ""
}

// Field returns a top-level field as decoded JSON (for tests and diagnostics).
func (s *Spec) Field(name string) (any, bool) {
	v, ok := s.doc[name]
	return v, ok
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}
