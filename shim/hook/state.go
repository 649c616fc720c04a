package hook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
)

// State is the OCI state a runtime writes to a hook's stdin.
type State struct {
	OCIVersion  string            `json:"ociVersion"`
	ID          string            `json:"id"`
	Status      string            `json:"status"`
	Pid         int               `json:"pid"`
	Bundle      string            `json:"bundle"`
	Annotations map[string]string `json:"annotations"`
}

// ErrBadState marks hook input that is not a usable OCI state.
var ErrBadState = errors.New("bad OCI state on stdin")

const maxStateBytes = 1 << 20

// ParseState reads and checks the OCI state from r.
func ParseState(r io.Reader) (State, error) {
	var st State
	data, err := io.ReadAll(io.LimitReader(r, maxStateBytes+1))
	if err != nil {
		return st, fmt.Errorf("%w: read: %w", ErrBadState, err)
	}
	if len(data) > maxStateBytes {
		return st, fmt.Errorf("%w: larger than %d bytes", ErrBadState, maxStateBytes)
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return st, fmt.Errorf("%w: empty input (kl-hook must be run by an OCI runtime as a hook)", ErrBadState)
	}
	if data[0] != '{' {
		return st, fmt.Errorf("%w: not a JSON object", ErrBadState)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&st); err != nil {
		return st, fmt.Errorf("%w: %w", ErrBadState, err)
	}
	// More() is false before a stray ']' or '}', so ask for the end of input itself.
	if _, err := dec.Token(); err != io.EOF {
		return st, fmt.Errorf("%w: trailing data after the JSON object", ErrBadState)
	}
	if err := checkID(st.ID); err != nil {
		return st, fmt.Errorf("%w: %w", ErrBadState, err)
	}
	if st.Pid < 0 || st.Pid > 1<<22 {
		return st, fmt.Errorf("%w: pid %d out of range", ErrBadState, st.Pid)
	}
	if st.Bundle != "" && !filepath.IsAbs(st.Bundle) {
		return st, fmt.Errorf("%w: bundle %q is not an absolute path", ErrBadState, st.Bundle)
	}
	return st, nil
}

// checkID accepts what runc accepts as a container id (letters, digits, _ + - .), so an
// id can name a registration and appear in a URL path safely.
func checkID(id string) error {
	if id == "" {
		return errors.New("no container id")
	}
	if len(id) > 1024 {
		return fmt.Errorf("container id longer than 1024 bytes")
	}
	if id == "." || id == ".." || strings.Trim(id, ".") == "" {
		return fmt.Errorf("container id %q", id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '+' || c == '-' || c == '.') {
			return fmt.Errorf("container id %q: character %q not allowed", id, c)
		}
	}
	return nil
}
