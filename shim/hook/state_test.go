package hook

import (
	"errors"
	"strings"
	"testing"
)

func TestParseState(t *testing.T) {
	st, err := ParseState(strings.NewReader(`{"ociVersion":"1.0.2","id":"abc_1.2-x","status":"creating","pid":4242,"bundle":"/run/b","annotations":{"kl.egress.mode":"proxy"},"future":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if st.ID != "abc_1.2-x" || st.Pid != 4242 || st.Bundle != "/run/b" || st.Annotations["kl.egress.mode"] != "proxy" {
		t.Errorf("ParseState = %+v", st)
	}
	tests := []struct{ name, in, want string }{
		{"empty", "  \n", "empty input"},
		{"not object", `["x"]`, "not a JSON object"},
		{"truncated", `{"id":"x"`, "unexpected EOF"},
		{"trailing", `{"id":"x"} {"id":"y"}`, "trailing data"},
		{"trailing brace", `{"id":"x","pid":3}}`, "trailing data"},
		{"trailing bracket", `{"id":"x","pid":3}]`, "trailing data"},
		{"no id", `{"pid":3}`, "no container id"},
		{"slash id", `{"id":"a/b"}`, "not allowed"},
		{"dots id", `{"id":".."}`, "container id"},
		{"negative pid", `{"id":"x","pid":-1}`, "out of range"},
		{"pid type", `{"id":"x","pid":"1"}`, "cannot unmarshal"},
		{"relative bundle", `{"id":"x","bundle":"b"}`, "not an absolute path"},
		{"annotation type", `{"id":"x","annotations":{"a":1}}`, "cannot unmarshal"},
		{"too big", `{"id":"` + strings.Repeat("a", 1<<20) + `"}`, "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseState(strings.NewReader(tt.in))
			if !errors.Is(err, ErrBadState) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ParseState(%.40q) = %v, want ErrBadState mentioning %q", tt.in, err, tt.want)
			}
		})
	}
}

// FuzzParseState: any input gives a state or ErrBadState, never a panic, and an accepted
// state always has a safe id and a sane pid.
func FuzzParseState(f *testing.F) {
	f.Add(`{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":42,"bundle":"/b","annotations":{"a":"b"}}`)
	f.Add(`{"id":"x","pid":0}`)
	f.Add(`{"id":"../etc","pid":1}`)
	f.Add(`{}`)
	f.Add("\x00")
	f.Fuzz(func(t *testing.T, in string) {
		st, err := ParseState(strings.NewReader(in))
		if err != nil {
			if !errors.Is(err, ErrBadState) {
				t.Fatalf("ParseState(%q): error not ErrBadState: %v", in, err)
			}
			return
		}
		if checkID(st.ID) != nil || strings.ContainsAny(st.ID, "/\x00") || st.Pid < 0 {
			t.Fatalf("ParseState(%q) accepted %+v", in, st)
		}
	})
}
