package imageref

import (
	"errors"
	"testing"
)

func TestNormalize(t *testing.T) {
	const dg = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	tests := []struct {
		name, in, want string
	}{
		{"official", "nginx", "docker.io/library/nginx:latest"},
		{"official tag", "nginx:1.25", "docker.io/library/nginx:1.25"},
		{"library", "library/nginx", "docker.io/library/nginx:latest"},
		{"hub user", "bitnami/redis:7", "docker.io/bitnami/redis:7"},
		{"hub explicit", "docker.io/nginx", "docker.io/library/nginx:latest"},
		{"index host", "index.docker.io/library/nginx:1", "docker.io/library/nginx:1"},
		{"registry", "ghcr.io/org/app", "ghcr.io/org/app:latest"},
		{"registry port", "localhost:5000/app:v2", "localhost:5000/app:v2"},
		{"localhost", "localhost/app", "localhost/app:latest"},
		{"IPv6 registry", "[fd00::1]:5000/team/app:v1", "[fd00::1]:5000/team/app:v1"},
		{"IPv6 registry, no port", "[fd00::1]/app", "[fd00::1]/app:latest"},
		{"digest", "nginx@" + dg, "docker.io/library/nginx@" + dg},
		{"tag and digest", "nginx:1@" + dg, "docker.io/library/nginx:1@" + dg},
		{"image id", dg, dg},
		{"deep path", "quay.io/a/b/c:x.y-z", "quay.io/a/b/c:x.y-z"},
		{"already normal", "docker.io/library/busybox:latest", "docker.io/library/busybox:latest"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Normalize(tt.in)
			if err != nil || got != tt.want {
				t.Fatalf("Normalize(%q) = %q, %v, want %q", tt.in, got, err, tt.want)
			}
			if app := string(Append(nil, tt.in)); app != tt.want {
				t.Fatalf("Append(%q) = %q, want %q", tt.in, app, tt.want)
			}
			again, err := Normalize(got)
			if err != nil || again != got {
				t.Fatalf("Normalize(%q) = %q, %v: not idempotent", got, again, err)
			}
		})
	}
}

func TestNormalizeBad(t *testing.T) {
	for _, in := range []string{"", "Nginx", "nginx:", "nginx:-x", "a//b", "nginx@sha256:zz", "sha256:abc", "ex ample", "reg:port/x", "/x", "x/",
		"[fd00::1/app", "[192.0.2.1]/app", "[fd00::1]x/app", "[fd00::1]:/app", "[fd00::1]:5x/app", "reg[1]/app", "[fe80::1%eth0]/app"} {
		if got, err := Normalize(in); !errors.Is(err, ErrBadReference) {
			t.Errorf("Normalize(%q) = %q, %v, want ErrBadReference", in, got, err)
		}
	}
}

// FuzzNormalize: Normalize never panics, and what it returns normalizes to itself.
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{"nginx", "localhost:5000/a/b:c", "nginx@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "A", ":", "a/@b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err := Normalize(in)
		if err != nil {
			if !errors.Is(err, ErrBadReference) {
				t.Fatalf("Normalize(%q): %v", in, err)
			}
			return
		}
		again, err := Normalize(out)
		if err != nil || again != out {
			t.Fatalf("Normalize(%q) = %q, then %q, %v", in, out, again, err)
		}
		if app := string(Append(nil, in)); app != out {
			t.Fatalf("Normalize(%q) = %q but Append writes %q", in, out, app)
		}
		if !IsNormal(out) {
			t.Fatalf("IsNormal(%q) = false for Normalize's own output", out)
		}
	})
}

// FuzzIsNormal: IsNormal(s) is exactly "Append leaves s as it is", for any string.
func FuzzIsNormal(f *testing.F) {
	for _, s := range []string{"nginx", "docker.io/nginx:1", "docker.io/a/b:1", "ghcr.io/a@sha256:00", "index.docker.io/a/b:c", "localhost/x:1", "a.b/c", "a.b@x/y:1", "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if s == "" {
			return
		}
		if got, want := IsNormal(s), string(Append(nil, s)) == s; got != want {
			t.Fatalf("IsNormal(%q) = %v, Append writes %q", s, got, Append(nil, s))
		}
	})
}

// TestAppendAllocs: with room in dst, Append does not allocate (the rules engine's hot path).
func TestAppendAllocs(t *testing.T) {
	buf := make([]byte, 0, 512)
	if n := testing.AllocsPerRun(100, func() { buf = Append(buf[:0], "registry.example:5000/team/app:v1") }); n != 0 {
		t.Errorf("Append: %v allocs, want 0", n)
	}
}
