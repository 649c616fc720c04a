package rules

import "testing"

func TestNormalizeImage(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"nginx", "docker.io/library/nginx:latest"},
		{"nginx:1.25", "docker.io/library/nginx:1.25"},
		{"nginx@sha256:abc", "docker.io/library/nginx@sha256:abc"},
		{"acme/app", "docker.io/acme/app:latest"},
		{"docker.io/nginx", "docker.io/library/nginx:latest"},
		{"index.docker.io/acme/app:2", "docker.io/acme/app:2"},
		{"localhost/app", "localhost/app:latest"},
		{"localhost:5000/app:v1", "localhost:5000/app:v1"},
		{"registry.cn-hangzhou.aliyuncs.com/acme/builder/go:1.22", "registry.cn-hangzhou.aliyuncs.com/acme/builder/go:1.22"},
		{"ghcr.io/a/b/c", "ghcr.io/a/b/c:latest"},
	}
	for _, tt := range tests {
		var buf [maxImageLen]byte
		if got := normalizeImage(tt.in, &buf); got != tt.want {
			t.Errorf("normalizeImage(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
