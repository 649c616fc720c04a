package rules

import (
	"errors"
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/kl-egress/kl/rules/pac"
)

// ScriptSource is the rules file equivalent to a PAC program given on its own
// (`--egress-pac FILE`) with default def: the bytes FromScript's policy has as Source, so
// another hop loads the same policy (and policy version) with Parse.
func ScriptSource(src []byte, def string) []byte {
	doc := struct {
		Script  string `yaml:"script"`
		Default string `yaml:"default,omitempty"`
	}{string(src), def}
	out, err := yaml.Marshal(doc)
	if err != nil {
		// Marshalling two strings cannot fail; a failure here is a bug in yaml.v3.
		panic(fmt.Sprintf("rules: marshal a script policy: %v", err))
	}
	return out
}

// FromScript builds a policy from a PAC program given on its own (`--egress-pac FILE`,
// seed 000) with def as its default ("" = direct). Errors carry the script's own line
// numbers, not those of the equivalent rules file.
func FromScript(name string, src []byte, def string, o LoadOptions) (*Policy, error) {
	if len(src) > pac.MaxScriptBytes {
		return nil, &Error{Code: CodeTooLarge, Msg: fmt.Sprintf("%s: script is %d bytes, at most %d", name, len(src), pac.MaxScriptBytes)}
	}
	s, err := pac.Compile(name, string(src), o.PAC)
	if err != nil {
		e := &Error{Code: CodeScript, Msg: err.Error()}
		var ce *pac.CompileError
		if errors.As(err, &ce) {
			e.Code, e.Line, e.Msg = Code(ce.Code), ce.Line, name+": "+ce.Msg
		}
		return nil, e
	}
	s.Close()
	p, err := Parse(name, ScriptSource(src, def), o)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.Line = 0 // lines of the generated file mean nothing to the user
		}
		return nil, err
	}
	return p, nil
}
