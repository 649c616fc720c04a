package rules

import "fmt"

// imageMatcher matches the image reference, as given and normalized, against a glob.
// A glob without wildcards also matches every spelling of the same reference
// (`nginx` matches `docker.io/library/nginx:latest` and the other way round).
type imageMatcher struct {
	glob string
	norm string // normalized form of a wildcard-free glob; "" otherwise
}

var _ matcher = (*imageMatcher)(nil)

func newImageMatcher(s string) (*imageMatcher, error) {
	if s == "" {
		return nil, &Error{Code: CodeBadGlob, Msg: "image: empty glob"}
	}
	if len(s) > maxImageLen/2 {
		return nil, &Error{Code: CodeBadGlob, Msg: fmt.Sprintf("image glob is %d bytes, at most %d", len(s), maxImageLen/2)}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '-' || c == '/' || c == ':' || c == '@' || c == '*' || c == '?'
		if !ok {
			return nil, &Error{Code: CodeBadGlob, Msg: fmt.Sprintf("image glob %q: character %q at offset %d is not allowed in an image reference", s, c, i)}
		}
	}
	m := &imageMatcher{glob: s}
	if !hasWild(s) {
		var buf [maxImageLen]byte
		m.norm = string([]byte(normalizeImage(s, &buf)))
	}
	return m, nil
}

func (m *imageMatcher) Match(v *view) bool {
	if v.image == "" {
		return false
	}
	if m.norm != "" {
		return v.image == m.glob || v.imageNorm == m.norm
	}
	return globMatch(m.glob, v.image) || globMatch(m.glob, v.imageNorm)
}

func (m *imageMatcher) String() string { return m.glob }
