package install

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// defaultState is what kl keeps in StatePath while kl's runtime is the runtime manager's
// default (dockerd's "default-runtime", containerd's default_runtime_name): which
// runtime that is, and the default before kl made it kl's (nil: the key was absent), so
// that uninstall puts back exactly that. The format is the same for every editor:
// {"runtime": "kl", "default-runtime": "runc"}. AddedTable records that there was not
// even a table to hold the default, and install added it (containerd's [….containerd]).
type defaultState struct {
	Runtime        string  `json:"runtime"`
	DefaultRuntime *string `json:"default-runtime,omitempty"`
	AddedTable     bool    `json:"added-table,omitempty"`
}

// parseDefaultState reads a state file; nil state (no file) is a nil record. Install
// --default replaces only "runc", "" or an absent default, so a record of anything
// else was not written by kl. Errors wrap errBadState.
func parseDefaultState(state []byte) (*defaultState, error) {
	if state == nil {
		return nil, nil
	}
	st := new(defaultState)
	dec := json.NewDecoder(bytes.NewReader(state))
	dec.DisallowUnknownFields()
	if err := dec.Decode(st); err != nil {
		return nil, fmt.Errorf("%w: %w", errBadState, err)
	}
	if st.Runtime == "" {
		return nil, fmt.Errorf(`%w: no "runtime"`, errBadState)
	}
	if p := st.DefaultRuntime; p != nil && *p != "runc" && *p != "" {
		return nil, fmt.Errorf(`%w: "default-runtime" is %q, which install --default never replaces`, errBadState, *p)
	}
	return st, nil
}

// defaultEditor is an Editor that can make kl's runtime the default and give the
// previous default back: Docker and Containerd. Apply edits it with editDefault, which
// keeps what uninstall puts back in StatePath.
type defaultEditor interface {
	Editor
	name() string
	// install is Install that also returns the default it replaced (prior), when it
	// made kl's runtime the default; nil when it did not.
	install(old []byte) (next []byte, prior *defaultState, err error)
	// uninstall is Uninstall that, when the default names kl's runtime and st records
	// what it was before, puts that back, in place.
	uninstall(old []byte, st *defaultState) ([]byte, error)
	// currentDefault is the file's default runtime, "" when it names none.
	currentDefault(data []byte) string
}

// editDefault is Install or Uninstall of a defaultEditor with its state file: state is
// the file's contents (nil when there is none), nextState the new ones (nil: remove the
// file); an error about the state file wraps errBadState. Install records the default it
// replaces; installing again while kl's runtime is the default keeps what the first
// install recorded (so any number of installs undo with one uninstall). Uninstall
// restores the recorded value and drops the state file. A state file is kept only
// while the default names the runtime it was recorded for: otherwise it is left over
// from an edit that stopped half way, or the operator has changed the default since,
// and it goes.
func editDefault(e defaultEditor, old, state []byte, uninstall bool) (next, nextState []byte, err error) {
	st, err := parseDefaultState(state)
	if err != nil {
		return nil, nil, err
	}
	if uninstall {
		if st != nil && st.Runtime != e.name() {
			// Another kl runtime's default (--runtime-name): not this uninstall's.
			next, err = e.uninstall(old, nil)
		} else {
			next, err = e.uninstall(old, st)
		}
	} else {
		var prior *defaultState
		if next, prior, err = e.install(old); prior != nil {
			st = prior
		}
	}
	if err != nil {
		return nil, nil, err
	}
	if st == nil || e.currentDefault(next) != st.Runtime {
		return next, nil, nil
	}
	if state != nil && sameJSON(state, st) {
		return next, state, nil // as recorded, byte for byte
	}
	if nextState, err = json.MarshalIndent(st, "", "  "); err != nil {
		return nil, nil, err
	}
	return next, append(nextState, '\n'), nil
}
