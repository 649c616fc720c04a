package pac

import (
	"fmt"

	"github.com/dop251/goja"
)

// Script is a compiled PAC program. It is safe for concurrent use.
type Script struct {
	name string
	prog *goja.Program
	o    Options
}

// Compile checks and compiles a PAC script once. The error is a *CompileError.
func Compile(name, src string, o Options) (*Script, error) {
	if len(src) > MaxScriptBytes {
		return nil, &CompileError{Code: CodeTooLarge, Msg: fmt.Sprintf("script is %d bytes, the bound is %d", len(src), MaxScriptBytes)}
	}
	prog, err := goja.Compile(name, src, false)
	if err != nil {
		return nil, &CompileError{Code: CodeScript, Msg: err.Error()}
	}
	return &Script{name: name, prog: prog, o: o}, nil
}

// Eval runs FindProxyForURL for one call.
func (s *Script) Eval(c Call) Result {
	return Result{Exit: "deny", Failed: true, Reason: "not implemented yet"}
}
