// Package imageref normalizes container image references the way Docker and containerd
// do, so that `nginx`, `library/nginx` and `docker.io/library/nginx:latest` name the same
// image in labels, registrations and rules. It is the one normalizer of kl: the rules
// engine matches with Append (lenient, allocation-free), the runtime wrapper and the
// daemon validate with Normalize. It does not pull or resolve anything, and imports
// nothing of kl, so small binaries (kl-runtime, kl-hook) can use it.
package imageref

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// ErrBadReference marks a string that is not an image reference.
var ErrBadReference = errors.New("invalid image reference")

const maxRefLen = 4096

// Normalize returns the fully qualified form of ref: registry host, repository path
// (with `library/` for official Docker Hub images) and a tag (`latest` when neither a tag
// nor a digest is given); a digest is kept. Image ids (`sha256:<hex>`) are returned as
// they are.
func Normalize(ref string) (string, error) {
	if ref == "" {
		return "", fmt.Errorf("%w: empty", ErrBadReference)
	}
	if len(ref) > maxRefLen {
		return "", fmt.Errorf("%w: longer than %d bytes", ErrBadReference, maxRefLen)
	}
	if strings.HasPrefix(ref, imageIDPrefix) {
		if !isHex(ref[len(imageIDPrefix):], 64) {
			return "", fmt.Errorf("%w: %q: bad image id", ErrBadReference, ref)
		}
		return ref, nil
	}
	name, digest, hasDigest := strings.Cut(ref, "@")
	if hasDigest {
		if err := checkDigest(digest); err != nil {
			return "", fmt.Errorf("%w: %q: %w", ErrBadReference, ref, err)
		}
	}
	tag := ""
	if i := strings.LastIndexByte(name, ':'); i > strings.LastIndexByte(name, '/') {
		name, tag = name[:i], name[i+1:]
		if err := checkTag(tag); err != nil {
			return "", fmt.Errorf("%w: %q: %w", ErrBadReference, ref, err)
		}
	}
	domain, path := "docker.io", name
	if first, rest, ok := strings.Cut(name, "/"); ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		domain, path = first, rest
		if err := checkDomain(domain); err != nil {
			return "", fmt.Errorf("%w: %q: %w", ErrBadReference, ref, err)
		}
	}
	if domain == "index.docker.io" {
		domain = "docker.io"
	}
	if domain == "docker.io" && !strings.Contains(path, "/") {
		path = "library/" + path
	}
	if err := checkPath(path); err != nil {
		return "", fmt.Errorf("%w: %q: %w", ErrBadReference, ref, err)
	}
	out := domain + "/" + path
	if tag != "" {
		out += ":" + tag
	} else if !hasDigest {
		out += ":latest"
	}
	if hasDigest {
		out += "@" + digest
	}
	return out, nil
}

const imageIDPrefix = "sha256:"

// Append appends the fully qualified form of ref to dst, as Normalize writes it, without
// checking the characters of its parts: the rules engine's form of whatever a workload
// claims to run, so that rules and flows normalize alike. For every ref that Normalize
// accepts, Append writes what Normalize returns. It allocates only when dst lacks the
// capacity; it appends nothing for "".
func Append(dst []byte, ref string) []byte {
	if ref == "" {
		return dst
	}
	if len(ref) == len(imageIDPrefix)+64 && strings.HasPrefix(ref, imageIDPrefix) && isHex(ref[len(imageIDPrefix):], 64) {
		return append(dst, ref...)
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
	dst = append(dst, domain...)
	dst = append(dst, '/')
	if library {
		dst = append(dst, "library/"...)
	}
	dst = append(dst, path...)
	dst = append(dst, tag...)
	return append(dst, digest...)
}

// IsNormal reports, cheaply and without allocating, whether Append would write ref
// unchanged: a registry host, a path and a tag or digest (or an image id). The rules
// engine then uses ref as it is instead of copying it.
func IsNormal(ref string) bool {
	if len(ref) == len(imageIDPrefix)+64 && ref[:len(imageIDPrefix)] == imageIDPrefix && isHex(ref[len(imageIDPrefix):], 64) {
		return true
	}
	// The name before any '@' has a registry host (its first component), maybe a
	// deeper path, and, without a digest, a tag after its last slash. IndexByte and
	// friends scan with vector instructions.
	name := ref
	at := strings.IndexByte(ref, '@')
	if at >= 0 {
		name = ref[:at]
	}
	slash := strings.IndexByte(name, '/')
	if slash < 0 {
		return false
	}
	first := name[:slash]
	dotted := strings.IndexByte(first, '.') >= 0 || strings.IndexByte(first, ':') >= 0
	lastSlash := strings.LastIndexByte(name, '/')
	if !normalHost(first, dotted, lastSlash > slash) {
		return false
	}
	return at >= 0 || strings.LastIndexByte(ref, ':') > lastSlash
}

// normalHost: a registry host that Append keeps as it is (with a path below docker.io
// that is not an official image's).
func normalHost(first string, dotted, deep bool) bool {
	switch {
	case first == "index.docker.io":
		return false
	case first == "docker.io":
		return deep
	}
	return dotted || first == "localhost"
}

func checkPath(path string) error {
	for _, comp := range strings.Split(path, "/") {
		if comp == "" {
			return errors.New("empty path component")
		}
		for i := 0; i < len(comp); i++ {
			c := comp[i]
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			case c == '.' || c == '_' || c == '-':
				if i == 0 || i == len(comp)-1 {
					return fmt.Errorf("path component %q starts or ends with a separator", comp)
				}
			default:
				return fmt.Errorf("character %q not allowed in repository path %q (lowercase letters, digits, . _ -)", c, path)
			}
		}
	}
	return nil
}

func checkDomain(d string) error {
	var host, port string
	var hasPort bool
	if rest, ok := strings.CutPrefix(d, "["); ok {
		// An IPv6 literal, as the distribution grammar has it: "[" IPv6address "]".
		addr, after, closed := strings.Cut(rest, "]")
		if ip, err := netip.ParseAddr(addr); !closed || err != nil || !ip.Is6() || ip.Zone() != "" {
			return fmt.Errorf("bad IPv6 registry host %q", d)
		}
		if after != "" {
			if port, hasPort = strings.CutPrefix(after, ":"); !hasPort {
				return fmt.Errorf("bad registry host %q: %q after the address", d, after)
			}
		}
	} else {
		host, port, hasPort = strings.Cut(d, ":")
		if host == "" {
			return errors.New("empty registry host")
		}
		for i := 0; i < len(host); i++ {
			c := host[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
				return fmt.Errorf("character %q not allowed in registry host %q", c, host)
			}
		}
	}
	if hasPort && (port == "" || !isDigits(port)) {
		return fmt.Errorf("bad registry port %q", port)
	}
	return nil
}

func checkTag(t string) error {
	if t == "" || len(t) > 128 {
		return fmt.Errorf("tag %q must be 1 to 128 characters", t)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || (i > 0 && (c == '.' || c == '-'))
		if !ok {
			return fmt.Errorf("character %q not allowed in tag %q", c, t)
		}
	}
	return nil
}

func checkDigest(d string) error {
	alg, hex, ok := strings.Cut(d, ":")
	if !ok || alg == "" || len(hex) < 32 {
		return fmt.Errorf("bad digest %q", d)
	}
	for i := 0; i < len(alg); i++ {
		c := alg[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("bad digest algorithm %q", alg)
		}
	}
	if !isHex(hex, len(hex)) {
		return fmt.Errorf("bad digest %q", d)
	}
	return nil
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
