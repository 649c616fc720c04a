package rules

import (
	"strings"
	"unsafe"
)

const maxImageLen = 512

// normalizeImage returns the fully qualified form of an image reference the way the
// Docker CLI resolves it: `nginx` is `docker.io/library/nginx:latest`,
// `acme/app` is `docker.io/acme/app:latest`, `index.docker.io/x/y:1` is
// `docker.io/x/y:1`, and a reference with a registry host (one with a dot or a port,
// or `localhost`) keeps it. The result is written into buf (it allocates only for
// references longer than buf). It returns "" for "".
func normalizeImage(ref string, buf *[maxImageLen]byte) string {
	if ref == "" {
		return ""
	}
	name, digest := ref, ""
	if i := strings.IndexByte(ref, '@'); i >= 0 {
		name, digest = ref[:i], ref[i:]
	}
	tag := ""
	if i := strings.LastIndexByte(name, ':'); i > strings.LastIndexByte(name, '/') {
		name, tag = name[:i], name[i:]
	}
	domain, path := "docker.io", name
	if i := strings.IndexByte(name, '/'); i >= 0 {
		first := name[:i]
		if strings.ContainsAny(first, ".:") || first == "localhost" {
			domain, path = first, name[i+1:]
		}
	}
	if domain == "index.docker.io" {
		domain = "docker.io"
	}
	library := domain == "docker.io" && !strings.Contains(path, "/")
	if tag == "" && digest == "" {
		tag = ":latest"
	}
	n := len(domain) + 1 + len(path) + len(tag) + len(digest)
	if library {
		n += len("library/")
	}
	var b []byte
	if n <= len(buf) {
		b = buf[:0]
	} else {
		b = make([]byte, 0, n)
	}
	b = append(b, domain...)
	b = append(b, '/')
	if library {
		b = append(b, "library/"...)
	}
	b = append(b, path...)
	b = append(b, tag...)
	b = append(b, digest...)
	return unsafe.String(unsafe.SliceData(b), len(b))
}
