package oci

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func testMods() List {
	return List{
		Env{Vars: []Var{
			{"HTTP_PROXY", "http://127.0.0.1:15080"}, {"http_proxy", "http://127.0.0.1:15080"},
			{"HTTPS_PROXY", "http://127.0.0.1:15080"}, {"https_proxy", "http://127.0.0.1:15080"},
			{"NODE_USE_ENV_PROXY", "1"},
		}, Force: []string{"http_proxy"}},
		Mount{Destination: "/etc/kl", Type: "bind", Source: "/run/kl/rules", Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}, Replace: []string{"/etc/kl/rules.yaml"}},
		Hook{Stage: "createRuntime", Path: "/usr/local/bin/kl-hook", Args: []string{"kl-hook", "create"}, Timeout: 30},
		Hook{Stage: "poststop", Path: "/usr/local/bin/kl-hook", Args: []string{"kl-hook", "delete"}, Timeout: 30},
	}
}

// TestGolden applies the modifiers to a spec full of fields kl does not model and
// compares with testdata/spec.golden.json (KL_UPDATE_GOLDEN=1 rewrites it).
func TestGolden(t *testing.T) {
	data, err := os.ReadFile("testdata/spec.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Parse("spec.json", data)
	if err != nil {
		t.Fatal(err)
	}
	if err := testMods().Modify(s); err != nil {
		t.Fatal(err)
	}
	got, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	const golden = "testdata/spec.golden.json"
	if os.Getenv("KL_UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with KL_UPDATE_GOLDEN=1 to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("edited spec differs from %s:\n%s", golden, got)
	}
	// Fields kl does not model survive exactly, numbers included.
	for _, frag := range []string{`18446744073709551615`, `12345678901234567890`, `1e400`, `1.50`, `"X=<&>"`, `"x-process-future"`, `"/usr/bin/nvidia"`, `"prestart"`} {
		if !bytes.Contains(got, []byte(frag)) {
			t.Errorf("edited spec lost %s", frag)
		}
	}
	if bytes.Contains(got, []byte("/home/evil")) {
		t.Errorf("the workload's own mount at /etc/kl/rules.yaml survived")
	}
	if bytes.Contains(got, []byte("/home/evil-dir")) {
		t.Errorf("the workload's own mount at /etc/kl/ survived")
	}
}

// TestMountAlternatives applies the two rules mounts kl-runtime chooses between (the
// published directory or the single file) in every order: one kl mount remains, the last.
func TestMountAlternatives(t *testing.T) {
	opts := []string{"rbind", "ro", "nosuid", "nodev", "noexec"}
	dir := Mount{Destination: "/etc/kl", Type: "bind", Source: "/run/kl/rules", Options: opts, Replace: []string{"/etc/kl/rules.yaml"}}
	file := Mount{Destination: "/etc/kl/rules.yaml", Type: "bind", Source: "/etc/kl/rules.yaml", Options: opts, Replace: []string{"/etc/kl"}}
	for _, order := range [][]Mount{{dir, file}, {file, dir}, {dir, dir, file, dir}} {
		data, _ := os.ReadFile("testdata/spec.json")
		s, err := Parse("spec.json", data)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range order {
			if err := m.Modify(s); err != nil {
				t.Fatal(err)
			}
		}
		last := order[len(order)-1]
		var dsts []string
		for _, x := range s.doc["mounts"].([]any) {
			dsts = append(dsts, x.(map[string]any)["destination"].(string))
		}
		if want := "/proc " + last.Destination; strings.Join(dsts, " ") != want {
			t.Errorf("after %v: mounts at %q, want %q", order, dsts, want)
		}
	}
	bad := Mount{Destination: "/etc/kl", Type: "bind", Source: "/run/kl/rules", Replace: []string{"etc/kl/rules.yaml"}}
	if err := bad.Modify(&Spec{doc: map[string]any{}}); err == nil {
		t.Error("a relative Replace destination was accepted")
	}
}

func TestIdempotent(t *testing.T) {
	data, _ := os.ReadFile("testdata/spec.json")
	s, err := Parse("spec.json", data)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range testMods() {
		if err := m.Modify(s); err != nil {
			t.Fatal(err)
		}
		once, _ := s.Marshal()
		if err := m.Modify(s); err != nil {
			t.Fatal(err)
		}
		twice, _ := s.Marshal()
		if !bytes.Equal(once, twice) {
			t.Errorf("%s applied twice differs from once:\n%s\n---\n%s", m, once, twice)
		}
	}
}

func TestEnv(t *testing.T) {
	tests := []struct {
		name  string
		env   []string
		force []string
		merge []string
		want  []string
	}{
		{"added", []string{"PATH=/bin"}, nil, nil, []string{"PATH=/bin", "HTTP_PROXY=k", "http_proxy=k", "NO_PROXY=n", "no_proxy=n"}},
		{"image wins, both spellings", []string{"http_proxy=img"}, nil, nil, []string{"http_proxy=img", "NO_PROXY=n", "no_proxy=n"}},
		{"forced replaces", []string{"http_proxy=img", "A=1"}, []string{"HTTP_PROXY"}, nil, []string{"HTTP_PROXY=k", "http_proxy=k", "A=1", "NO_PROXY=n", "no_proxy=n"}},
		{"force all", []string{"NO_PROXY=x", "HTTP_PROXY=y"}, []string{"*"}, []string{"NO_PROXY"}, []string{"NO_PROXY=n", "no_proxy=n", "HTTP_PROXY=k", "http_proxy=k"}},
		{"nil env", nil, nil, nil, []string{"HTTP_PROXY=k", "http_proxy=k", "NO_PROXY=n", "no_proxy=n"}},
		// An image's NO_PROXY used to take the whole group, kl's loopback entries with it.
		{"merged list", []string{"no_proxy=img.example, n", "A=1", "NO_PROXY=other"}, nil, []string{"no_proxy"},
			[]string{"NO_PROXY=img.example,n,other", "no_proxy=img.example,n,other", "A=1", "HTTP_PROXY=k", "http_proxy=k"}},
		{"merged, empty in the image", []string{"NO_PROXY="}, nil, []string{"NO_PROXY"}, []string{"NO_PROXY=n", "no_proxy=n", "HTTP_PROXY=k", "http_proxy=k"}},
		{"merged but forced: replaced", []string{"NO_PROXY=img"}, []string{"no_proxy"}, []string{"NO_PROXY"}, []string{"NO_PROXY=n", "no_proxy=n", "HTTP_PROXY=k", "http_proxy=k"}},
		{"merged, not in the spec", []string{"PATH=/bin"}, nil, []string{"NO_PROXY"}, []string{"PATH=/bin", "HTTP_PROXY=k", "http_proxy=k", "NO_PROXY=n", "no_proxy=n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Spec{doc: map[string]any{"process": map[string]any{}}}
			if tt.env != nil {
				_ = s.setEnv(tt.env)
			}
			m := Env{Vars: []Var{{"HTTP_PROXY", "k"}, {"http_proxy", "k"}, {"NO_PROXY", "n"}, {"no_proxy", "n"}}, Force: tt.force, Merge: tt.merge}
			if err := m.Modify(s); err != nil {
				t.Fatal(err)
			}
			got, _ := s.Env()
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("env = %q, want %q", got, tt.want)
			}
			if err := m.Modify(s); err != nil {
				t.Fatal(err)
			}
			if again, _ := s.Env(); strings.Join(again, " ") != strings.Join(got, " ") {
				t.Errorf("applied twice: env = %q, want %q", again, got)
			}
		})
	}
}

// runc runs a stage's hooks in order and stops at the first that fails: kl's poststop
// goes first so that another hook's failure cannot leave kl's registration behind.
func TestHookFirst(t *testing.T) {
	other := map[string]any{"path": "/usr/bin/other", "args": []any{"other", "stop"}}
	s := &Spec{doc: map[string]any{"hooks": map[string]any{"poststop": []any{other}, "createRuntime": []any{other}}}}
	mods := List{
		Hook{Stage: "createRuntime", Path: "/kl-hook", Args: []string{"kl-hook", "create"}},
		Hook{Stage: "poststop", Path: "/kl-hook", Args: []string{"kl-hook", "delete"}, First: true},
	}
	for range 2 {
		if err := mods.Modify(s); err != nil {
			t.Fatal(err)
		}
		hooks := s.doc["hooks"].(map[string]any)
		for stage, want := range map[string][]string{"createRuntime": {"/usr/bin/other", "/kl-hook"}, "poststop": {"/kl-hook", "/usr/bin/other"}} {
			var got []string
			for _, h := range hooks[stage].([]any) {
				got = append(got, h.(map[string]any)["path"].(string))
			}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("%s hooks = %q, want %q", stage, got, want)
			}
		}
	}
}

func TestAnnotation(t *testing.T) {
	s := &Spec{doc: map[string]any{"annotations": map[string]any{"a": "1"}}}
	for range 2 {
		if err := (Annotation{Key: "kl.x", Value: "proxy"}).Modify(s); err != nil {
			t.Fatal(err)
		}
	}
	if ann, _ := s.Annotations(); len(ann) != 2 || ann["a"] != "1" || ann["kl.x"] != "proxy" {
		t.Errorf("annotations = %v", ann)
	}
	if err := (Annotation{Key: "kl.x"}).Modify(s); err != nil {
		t.Fatal(err)
	}
	if ann, _ := s.Annotations(); len(ann) != 1 || ann["a"] != "1" {
		t.Errorf("annotations after removal = %v", ann)
	}
	s = &Spec{doc: map[string]any{}}
	if err := (Annotation{Key: "kl.x", Value: "env"}).Modify(s); err != nil {
		t.Fatal(err)
	}
	if ann, _ := s.Annotations(); ann["kl.x"] != "env" {
		t.Errorf("annotations = %v", ann)
	}
}

func TestParseBad(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"empty", ``, "EOF"},
		{"array", `[]`, "top level is an array"},
		{"trailing", `{} {}`, "trailing data"},
		{"process string", `{"process":"x"}`, `"process" is a string`},
		{"env object", `{"process":{"env":{}}}`, "process.env is an object"},
		{"env number", `{"process":{"env":[1]}}`, "process.env[0] is a number"},
		{"mounts object", `{"mounts":{}}`, `"mounts" is an object`},
		{"annotation number", `{"annotations":{"a":1}}`, `annotation "a" is a number`},
		{"garbage", `{"a":`, "unexpected EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("config.json", []byte(tt.in))
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "config.json") {
				t.Errorf("Parse(%q) = %v, want ErrMalformed mentioning %q and the file", tt.in, err, tt.want)
			}
		})
	}
	if err := (Hook{Stage: "poststop", Path: "/x", Args: []string{"x"}}).Modify(&Spec{doc: map[string]any{"hooks": map[string]any{"poststop": "no"}}}); !errors.Is(err, ErrMalformed) {
		t.Errorf("hook into a non-array stage: %v", err)
	}
}

func TestSaveAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, ConfigName)
	if err := os.WriteFile(p, []byte(`{"process":{"env":[]},"z":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := (Env{Vars: []Var{{"A", "1"}}}).Modify(s); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(dir); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(p)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode after save = %v, want 0600", fi.Mode().Perm())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("bundle has %d entries after save, want just config.json", len(ents))
	}
	again, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if env, _ := again.Env(); len(env) != 1 || env[0] != "A=1" {
		t.Errorf("env after save = %q", env)
	}
	if _, err := Load(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing bundle) = %v, want ErrNotExist", err)
	}
}

// FuzzModify: any config.json (and any process file) either fails to parse with ErrMalformed or takes every
// modifier, twice, with the same result, and encodes to JSON that parses again.
func FuzzModify(f *testing.F) {
	seed, _ := os.ReadFile("testdata/spec.json")
	f.Add(string(seed))
	f.Add(`{"process":{"env":["A=1","HTTP_PROXY"]},"hooks":{"poststop":[{"path":"/x"}]},"mounts":[{"destination":"/etc/kl/../kl/rules.yaml"}]}`)
	f.Add(`{"hooks":{"createRuntime":null},"mounts":null,"process":null}`)
	f.Add(`{}`)
	f.Add(`{"env":["A=1","http_proxy=x"],"args":["sh"]}`)
	f.Fuzz(func(t *testing.T, in string) {
		fuzzProcess(t, in)
		s, err := Parse("config.json", []byte(in))
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Parse(%q): %v is not ErrMalformed", in, err)
			}
			return
		}
		if err := testMods().Modify(s); err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Modify(%q): %v is not ErrMalformed", in, err)
			}
			return
		}
		once, err := s.Marshal()
		if err != nil {
			t.Fatalf("Marshal after Modify(%q): %v", in, err)
		}
		if err := testMods().Modify(s); err != nil {
			t.Fatalf("second Modify(%q): %v", in, err)
		}
		twice, _ := s.Marshal()
		if !bytes.Equal(once, twice) {
			t.Fatalf("Modify(%q) not idempotent:\n%s\n%s", in, once, twice)
		}
		if _, err := Parse("again", once); err != nil {
			t.Fatalf("edited spec does not parse: %v\n%s", err, once)
		}
	})
}

// fuzzProcess: the same input as a process file (runc exec --process FILE, written by
// containerd or dockerd) fails with ErrMalformed or takes the env edit, twice, with the
// same result, and encodes to a process object that parses again.
func fuzzProcess(t *testing.T, in string) {
	p, err := ParseProcess("process.json", []byte(in))
	if err != nil {
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("ParseProcess(%q): %v is not ErrMalformed", in, err)
		}
		return
	}
	env := testMods()[0]
	if err := env.Modify(p); err != nil {
		t.Fatalf("env edit of process file %q: %v", in, err)
	}
	once, err := p.Marshal()
	if err != nil {
		t.Fatalf("Marshal process file %q: %v", in, err)
	}
	if err := env.Modify(p); err != nil {
		t.Fatalf("second env edit of process file %q: %v", in, err)
	}
	if twice, _ := p.Marshal(); !bytes.Equal(once, twice) {
		t.Fatalf("env edit of process file %q not idempotent:\n%s\n%s", in, once, twice)
	}
	if _, err := ParseProcess("again", once); err != nil {
		t.Fatalf("edited process file does not parse: %v\n%s", err, once)
	}
}

// A process file (runc exec --process) takes the same env edit as a spec and is written
// back as the process object alone, with every field kl does not model as it was.
func TestProcessFile(t *testing.T) {
	in := `{"terminal":false,"user":{"uid":0,"gid":0,"additionalGids":[18446744073709551615]},"args":["sh","-c","x"],` +
		`"env":["PATH=/bin","https_proxy=http://mine:1"],"cwd":"/","capabilities":{"bounding":["CAP_KILL"]},"x-future":{"n":1.50}}`
	p := filepath.Join(t.TempDir(), "runc-process123")
	if err := os.WriteFile(p, []byte(in), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := LoadProcessFile(p)
	if err != nil {
		t.Fatal(err)
	}
	env := Env{Vars: []Var{{"HTTP_PROXY", "http://127.0.0.1:15080"}, {"http_proxy", "http://127.0.0.1:15080"}, {"HTTPS_PROXY", "http://127.0.0.1:15080"}, {"https_proxy", "http://127.0.0.1:15080"}}}
	for range 2 {
		if err := env.Modify(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SaveFile(p); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(p)
	if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("mode after save: %v %v", st, err)
	}
	back, err := ParseProcess("saved", got)
	if err != nil {
		t.Fatalf("saved process file does not parse: %v\n%s", err, got)
	}
	if e, _ := back.Env(); strings.Join(e, " ") != "PATH=/bin https_proxy=http://mine:1 HTTP_PROXY=http://127.0.0.1:15080 http_proxy=http://127.0.0.1:15080" {
		t.Errorf("env = %q", e)
	}
	if bytes.Contains(got, []byte(`"process"`)) {
		t.Errorf("process file wrapped in a spec:\n%s", got)
	}
	for _, frag := range []string{`18446744073709551615`, `1.50`, `"x-future"`, `"CAP_KILL"`, `"terminal": false`} {
		if !bytes.Contains(got, []byte(frag)) {
			t.Errorf("process file lost %s:\n%s", frag, got)
		}
	}
	for _, bad := range []string{`[]`, `{"env":"x"}`, `{} {}`, `{"env":[1]}`} {
		if _, err := ParseProcess("bad", []byte(bad)); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseProcess(%s) = %v, want ErrMalformed", bad, err)
		}
	}
}
