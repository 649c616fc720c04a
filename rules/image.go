package rules

import (
	"unsafe"

	"github.com/kl-egress/kl/rules/imageref"
)

const maxImageLen = 512

// NormalizeImage validates an image reference and returns its fully qualified form
// (`nginx` is `docker.io/library/nginx:latest`); errors wrap imageref.ErrBadReference.
// Rules match images in this form.
func NormalizeImage(ref string) (string, error) { return imageref.Normalize(ref) }

// normalizeImage returns the fully qualified form of an image reference the way the
// Docker CLI resolves it (imageref.Append): `nginx` is `docker.io/library/nginx:latest`,
// `acme/app` is `docker.io/acme/app:latest`, `index.docker.io/x/y:1` is
// `docker.io/x/y:1`, and a reference with a registry host (one with a dot or a port,
// or `localhost`) keeps it. The result is written into buf (it allocates only for
// references longer than buf). It returns "" for "".
func normalizeImage(ref string, buf *[maxImageLen]byte) string {
	if imageref.IsNormal(ref) {
		return ref
	}
	return appendNormal(ref, buf)
}

// appendNormal is normalizeImage for a reference known not to be in normal form.
func appendNormal(ref string, buf *[maxImageLen]byte) string {
	b := imageref.Append(buf[:0], ref)
	return unsafe.String(unsafe.SliceData(b), len(b))
}
