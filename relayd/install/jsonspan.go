package install

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// A span is one JSON value located in its file: [Start, End) byte offsets. Objects keep
// their members and arrays their elements, each also located, so an edit can splice text
// in or out next to them and leave every other byte of the file alone.
type span struct {
	Start, End int
	Kind       byte // '{', '[', '"', or 'v' for numbers, true, false, null
	Members    []member
	Elems      []*span
}

type member struct {
	Key      string
	KeyStart int // offset of the key's opening quote
	Value    *span
}

// get returns the value of an object's member key, the last one when the key is
// repeated (as encoding/json, and so dockerd and libcni, reads it), or nil.
func (s *span) get(key string) *span {
	var v *span
	for _, m := range s.Members {
		if m.Key == key {
			v = m.Value
		}
	}
	return v
}

// parseSpans locates every value of a JSON document. The document must be valid JSON
// (checked first with the standard library, which names the offending offset).
func parseSpans(data []byte) (*span, error) {
	if !json.Valid(data) {
		var v any
		err := json.Unmarshal(data, &v)
		if err == nil {
			err = fmt.Errorf("not a single JSON value")
		}
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	p := &spanParser{b: data}
	p.ws()
	v, err := p.value()
	if err != nil {
		return nil, err
	}
	return v, nil
}

type spanParser struct {
	b []byte
	i int
}

func (p *spanParser) ws() {
	for p.i < len(p.b) && strings.IndexByte(" \t\r\n", p.b[p.i]) >= 0 {
		p.i++
	}
}

func (p *spanParser) value() (*span, error) {
	if p.i >= len(p.b) {
		return nil, fmt.Errorf("unexpected end of JSON at offset %d", p.i)
	}
	s := &span{Start: p.i}
	switch c := p.b[p.i]; c {
	case '{':
		s.Kind = '{'
		p.i++
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == '}' {
			p.i++
			break
		}
		for {
			p.ws()
			ks := p.i
			key, err := p.str()
			if err != nil {
				return nil, err
			}
			p.ws()
			if p.i >= len(p.b) || p.b[p.i] != ':' {
				return nil, fmt.Errorf("expected ':' at offset %d", p.i)
			}
			p.i++
			p.ws()
			v, err := p.value()
			if err != nil {
				return nil, err
			}
			s.Members = append(s.Members, member{Key: key, KeyStart: ks, Value: v})
			p.ws()
			if p.i < len(p.b) && p.b[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.b) && p.b[p.i] == '}' {
				p.i++
				break
			}
			return nil, fmt.Errorf("expected ',' or '}' at offset %d", p.i)
		}
	case '[':
		s.Kind = '['
		p.i++
		p.ws()
		if p.i < len(p.b) && p.b[p.i] == ']' {
			p.i++
			break
		}
		for {
			p.ws()
			v, err := p.value()
			if err != nil {
				return nil, err
			}
			s.Elems = append(s.Elems, v)
			p.ws()
			if p.i < len(p.b) && p.b[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.b) && p.b[p.i] == ']' {
				p.i++
				break
			}
			return nil, fmt.Errorf("expected ',' or ']' at offset %d", p.i)
		}
	case '"':
		s.Kind = '"'
		if _, err := p.str(); err != nil {
			return nil, err
		}
	default:
		s.Kind = 'v'
		for p.i < len(p.b) && strings.IndexByte(",]} \t\r\n", p.b[p.i]) < 0 {
			p.i++
		}
	}
	s.End = p.i
	return s, nil
}

// str reads a JSON string starting at the current offset and returns it unquoted.
func (p *spanParser) str() (string, error) {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return "", fmt.Errorf("expected a string at offset %d", p.i)
	}
	start := p.i
	p.i++
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case '\\':
			p.i += 2
			continue
		case '"':
			p.i++
			var s string
			if err := json.Unmarshal(p.b[start:p.i], &s); err != nil {
				return "", fmt.Errorf("string at offset %d: %w", start, err)
			}
			return s, nil
		}
		p.i++
	}
	return "", fmt.Errorf("unterminated string at offset %d", start)
}

// lineIndent returns the whitespace between the start of the line holding offset and
// offset itself, and whether offset is the first non-blank character of its line.
func lineIndent(b []byte, off int) (string, bool) {
	i := off
	for i > 0 && (b[i-1] == ' ' || b[i-1] == '\t') {
		i--
	}
	if i == 0 || b[i-1] == '\n' {
		return string(b[i:off]), true
	}
	return "", false
}

// lineLead returns the whitespace at the start of the line holding offset.
func lineLead(b []byte, off int) string {
	i := bytes.LastIndexByte(b[:off], '\n') + 1
	j := i
	for j < off && (b[j] == ' ' || b[j] == '\t') {
		j++
	}
	return string(b[i:j])
}

// indentUnit guesses the file's indentation step: the indent of the first member of the
// top-level object when it sits on its own line, else two spaces.
func indentUnit(b []byte, root *span) string {
	if root != nil && root.Kind == '{' && len(root.Members) > 0 {
		if ind, own := lineIndent(b, root.Members[0].KeyStart); own && ind != "" {
			rootInd, _ := lineIndent(b, root.Start)
			if strings.HasPrefix(ind, rootInd) && len(ind) > len(rootInd) {
				return ind[len(rootInd):]
			}
			return ind
		}
	}
	return "  "
}

// render formats v as JSON: multi-line with the given line prefix and indent unit when
// the surrounding file is multi-line, compact otherwise. Nothing is HTML-escaped.
func render(v any, prefix, unit string, multiline bool) (string, error) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if multiline {
		enc.SetIndent(prefix, unit)
	}
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

// removeEntry returns data without entry idx of a container (an array element or an
// object member), taking the separator before it (after it, for the first of several)
// with it, so that it undoes insertLast exactly. starts and ends locate every entry
// (for members, from the key's opening quote to the end of the value).
func removeEntry(data []byte, starts, ends []int, idx int) []byte {
	var from, to int
	switch {
	case len(starts) == 1:
		// The only entry: drop everything between the brackets.
		from, to = starts[0], ends[0]
		// Also swallow surrounding whitespace up to the brackets.
		for from > 0 && strings.IndexByte(" \t\r\n", data[from-1]) >= 0 {
			from--
		}
		for to < len(data) && strings.IndexByte(" \t\r\n", data[to]) >= 0 {
			to++
		}
	case idx > 0:
		// Remove from the end of the previous entry to the end of this one: the comma,
		// the whitespace and the entry.
		from, to = ends[idx-1], ends[idx]
	default:
		// The first of several: remove from its start to the start of the next one.
		from, to = starts[0], starts[1]
	}
	out := make([]byte, 0, len(data)-(to-from))
	out = append(out, data[:from]...)
	return append(out, data[to:]...)
}

// insertLast returns data with text added as the last entry of container c (an array
// element, or a `"key": value` member), written the way the existing entries are: on
// its own line with their indentation when they are one per line. Into an empty
// container it goes one level deeper than the container's line, or, in a one-line
// document, on that line. It also returns the indentation the entry got, for rendering
// nested values.
func insertLast(data []byte, c *span, starts, ends []int, unit string, text func(indent string, multiline bool) (string, error)) ([]byte, error) {
	var ins string
	var at, to int
	if len(starts) > 0 {
		last := len(starts) - 1
		ind, own := lineIndent(data, starts[last])
		t, err := text(ind, own)
		if err != nil {
			return nil, err
		}
		if own {
			ins = ",\n" + ind + t
		} else {
			ins = ", " + t
		}
		at, to = ends[last], ends[last]
	} else if doc := bytes.TrimSpace(data); bytes.IndexByte(doc, '\n') < 0 && c.Start != len(data)-len(bytes.TrimLeft(data, " \t\r\n")) {
		// An empty container inside a one-line document: the entry stays on that line.
		t, err := text("", false)
		if err != nil {
			return nil, err
		}
		ins = t
		at, to = c.Start+1, c.End-1
	} else {
		// The entries go one level deeper than the line the bracket is on (a member's
		// line, for `"runtimes": {}`).
		cind := lineLead(data, c.Start)
		t, err := text(cind+unit, true)
		if err != nil {
			return nil, err
		}
		ins = "\n" + cind + unit + t + "\n" + cind
		at, to = c.Start+1, c.End-1
	}
	out := make([]byte, 0, len(data)+len(ins))
	out = append(out, data[:at]...)
	out = append(out, ins...)
	return append(out, data[to:]...), nil
}

// entries returns the start and end offsets of a container's entries.
func entries(c *span) (starts, ends []int) {
	if c.Kind == '{' {
		for _, m := range c.Members {
			starts = append(starts, m.KeyStart)
			ends = append(ends, m.Value.End)
		}
		return starts, ends
	}
	for _, e := range c.Elems {
		starts = append(starts, e.Start)
		ends = append(ends, e.End)
	}
	return starts, ends
}
