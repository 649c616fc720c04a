package install

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// defaultState is what kl keeps in StatePath for uninstall to undo exactly what install
// did where the file itself cannot say it. The format is the same for every editor.
//
// While kl's runtime is the runtime manager's default (dockerd's "default-runtime",
// containerd's default_runtime_name), it holds which runtime that is and the default
// before kl made it kl's (nil: the key was absent), so that uninstall puts back exactly
// that: {"runtime": "kl", "default-runtime": "runc"}. AddedTable records that there was
// not even a table to hold the default, and install added it (containerd's
// [….containerd]).
//
// While kl's runtime is in the file, it also holds what install found of the file
// itself: Created, that the file did not exist (uninstall removes it again when nothing
// but what install started it with is left, and CreatedDir, the top directory install
// made for it, when that holds nothing else), and EmptyRuntimes, that daemon.json had an
// empty "runtimes" object, which uninstall leaves (it takes out a "runtimes" that holds
// only kl's runtime otherwise: install added it). A record without "default-runtime"
// says the key was absent before install, which is also true of a file install created.
type defaultState struct {
	Runtime        string  `json:"runtime"`
	DefaultRuntime *string `json:"default-runtime,omitempty"`
	AddedTable     bool    `json:"added-table,omitempty"`
	Created        bool    `json:"created,omitempty"`
	CreatedDir     string  `json:"created-dir,omitempty"`
	EmptyRuntimes  bool    `json:"empty-runtimes,omitempty"`
}

// structural reports whether st records something about the file beyond its default.
func (st *defaultState) structural() bool { return st.Created || st.EmptyRuntimes }

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
	// uninstall is Uninstall that, when st records what install found (nil: no
	// record), undoes exactly that: the default before kl's, a "runtimes" it added.
	uninstall(old []byte, st *defaultState) ([]byte, error)
	// currentDefault is the file's default runtime, "" when it names none.
	currentDefault(data []byte) string
	// hasRuntime reports whether kl's runtime is defined in data.
	hasRuntime(data []byte) bool
	// emptyRuntimes reports whether data holds the object kl's runtime goes into, with
	// nothing in it (daemon.json's `"runtimes": {}`), which uninstall must then leave.
	emptyRuntimes(data []byte) bool
	// blank reports whether data is what install starts a file it creates with, before
	// adding kl's runtime: a created file that uninstall leaves so is removed.
	blank(data []byte) bool
}

// editDefault is Install or Uninstall of a defaultEditor with its state file: state is
// the file's contents (nil when there is none), nextState the new ones (nil: remove the
// file); an error about the state file wraps errBadState. created says that the file
// does not exist yet (install creates it), createdDir the top directory Apply makes
// for it ("" when none). remove says that uninstall leaves nothing but what install
// created, so the file goes.
//
// Install records the default it replaces; installing again while kl's runtime is the
// default keeps what the first install recorded (so any number of installs undo with
// one uninstall). It also records a file it creates and an empty "runtimes" it fills,
// kept while kl's runtime is in the file. Uninstall restores the recorded default,
// removes a file install created when nothing else is left in it, and drops the state
// file. The default's record is kept only while the default names the runtime it was
// recorded for: otherwise it is left over from an edit that stopped half way, or the
// operator has changed the default since, and it goes.
func editDefault(e defaultEditor, old, state []byte, uninstall, created bool, createdDir string) (next, nextState []byte, remove bool, err error) {
	st, err := parseDefaultState(state)
	if err != nil {
		return nil, nil, false, err
	}
	mine := st != nil && st.Runtime == e.name()
	if uninstall {
		var rec *defaultState
		if mine {
			rec = st
		}
		if next, err = e.uninstall(old, rec); err != nil {
			return nil, nil, false, err
		}
		if mine {
			// kl's runtime is out: nothing of the record is needed any more.
			return next, nil, st.Created && e.blank(next), nil
		}
		// No record, or another kl runtime's (--runtime-name): kept while it holds.
	} else {
		fresh := !e.hasRuntime(old)
		empty := e.emptyRuntimes(old)
		var prior *defaultState
		if next, prior, err = e.install(old); err != nil {
			return nil, nil, false, err
		}
		switch {
		case mine && fresh:
			// kl's runtime was taken out by hand since the record was made: what the
			// file was then is not what it is now.
			st.Created, st.CreatedDir, st.EmptyRuntimes = false, "", false
		case !mine && (prior != nil || created || empty):
			st = &defaultState{Runtime: e.name()}
		}
		if prior != nil {
			st.DefaultRuntime, st.AddedTable = prior.DefaultRuntime, prior.AddedTable
		}
		if created {
			st.Created, st.CreatedDir = true, createdDir
		}
		if empty {
			st.EmptyRuntimes = true
		}
	}
	if st != nil && e.currentDefault(next) != st.Runtime {
		// The default is not the recorded runtime: the default's record goes, the
		// rest while there is any.
		st.DefaultRuntime, st.AddedTable = nil, false
		if !st.structural() {
			st = nil
		}
	}
	if st == nil {
		return next, nil, false, nil
	}
	if state != nil && sameJSON(state, st) {
		return next, state, false, nil // as recorded, byte for byte
	}
	if nextState, err = json.MarshalIndent(st, "", "  "); err != nil {
		return nil, nil, false, err
	}
	return next, append(nextState, '\n'), false, nil
}
