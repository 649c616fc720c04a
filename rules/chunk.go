package rules

import (
	"bytes"

	"gopkg.in/yaml.v3"
)

// Chunked parsing thresholds (variables so that tests can exercise small files).
var (
	chunkMinBytes = 256 << 10 // smaller files are parsed whole
	chunkItems    = 2000      // rules per chunk
)

// rulesBlock locates the block sequence under a top-level `rules:` key by its lines:
// start and end are byte offsets of the first item and of the end of the block,
// items the byte offsets where items start, startLine the 0-based line of start.
type rulesBlock struct {
	start, end int
	startLine  int
	items      []int
	itemLines  []int
}

// isBlank reports whether a line (without its newline) is empty or only a comment.
func isBlank(l []byte) bool {
	t := bytes.TrimLeft(l, " \t\r")
	return len(t) == 0 || t[0] == '#'
}

func indentOf(l []byte) int {
	n := 0
	for n < len(l) && l[n] == ' ' {
		n++
	}
	return n
}

func isItem(l []byte, ind int) bool {
	if indentOf(l) != ind || len(l) <= ind || l[ind] != '-' {
		return false
	}
	return len(l) == ind+1 || l[ind+1] == ' ' || l[ind+1] == '\r'
}

// findRulesBlock finds the rules list in the simple layout every generated or
// hand-written large file has: `rules:` alone on its line at column 0, then items
// `- ` at one indentation, the block ending at a column-0 line that is not an item.
// It reports false for anything else (flow style, directives, several documents,
// `rules:` twice), leaving the file to the whole-document parse.
func findRulesBlock(data []byte) (rulesBlock, bool) {
	var b rulesBlock
	if !onlyNewlineBreaks(data) {
		return b, false
	}
	found, inBlock, done := false, false, false
	ind := -1
	line := 0
	for off := 0; off < len(data); line++ {
		end := bytes.IndexByte(data[off:], '\n')
		next := len(data)
		if end >= 0 {
			next = off + end + 1
			end = off + end
		} else {
			end = len(data)
		}
		l := data[off:end]
		if len(l) > 0 && (l[0] == '%' || bytes.HasPrefix(l, []byte("---")) || bytes.HasPrefix(l, []byte("..."))) {
			return b, false
		}
		switch {
		case inBlock && isBlank(l):
		case inBlock && ind < 0:
			ind = indentOf(l)
			if !isItem(l, ind) {
				return b, false
			}
			b.start, b.startLine = off, line
			b.items, b.itemLines = append(b.items, off), append(b.itemLines, line)
		case inBlock && isItem(l, ind):
			b.items, b.itemLines = append(b.items, off), append(b.itemLines, line)
		case inBlock && indentOf(l) > ind:
		case inBlock:
			if indentOf(l) != 0 {
				return b, false
			}
			b.end, inBlock, done = off, false, true
		case bytes.HasPrefix(l, []byte("rules:")):
			if found || !isBlank(l[len("rules:"):]) {
				return b, false
			}
			found, inBlock = true, true
		}
		off = next
	}
	if inBlock {
		b.end, done = len(data), true
	}
	return b, found && done && len(b.items) > 0
}

func parseChunked(name string, data []byte, o LoadOptions) (*Policy, bool) {
	b, ok := findRulesBlock(data)
	if !ok {
		return nil, false
	}
	// The rest of the file, with the block's lines emptied so lines keep their numbers.
	head := make([]byte, 0, b.start+len(data)-b.end+bytes.Count(data[b.start:b.end], []byte{'\n'}))
	head = append(head, data[:b.start]...)
	head = append(head, bytes.Repeat([]byte{'\n'}, bytes.Count(data[b.start:b.end], []byte{'\n'}))...)
	head = append(head, data[b.end:]...)
	p, err := parseDoc(name, head, o)
	if err != nil || len(p.rules) > 0 {
		return nil, false
	}
	p.rules = make([]rule, 0, len(b.items))
	for i := 0; i < len(b.items); i += chunkItems {
		j := min(i+chunkItems, len(b.items))
		end := b.end
		if j < len(b.items) {
			end = b.items[j]
		}
		var doc yaml.Node
		if err := yaml.Unmarshal(data[b.items[i]:end], &doc); err != nil {
			return nil, false
		}
		if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.SequenceNode || len(doc.Content[0].Content) != j-i {
			return nil, false
		}
		shiftLines(doc.Content[0], b.itemLines[i])
		for _, item := range doc.Content[0].Content {
			if err := p.addRule(item, o); err != nil {
				return nil, false
			}
		}
	}
	return p, true
}

// shiftLines adds off to the line of every node of a tree.
func shiftLines(n *yaml.Node, off int) {
	n.Line += off
	for _, c := range n.Content {
		shiftLines(c, off)
	}
}

// onlyNewlineBreaks reports whether every YAML line break in data is "\n" or "\r\n",
// so that counting '\n' counts lines as the YAML parser does (it also breaks lines at
// a lone '\r', NEL, and the Unicode line and paragraph separators).
func onlyNewlineBreaks(data []byte) bool {
	for i := bytes.IndexByte(data, '\r'); i >= 0; {
		if i+1 >= len(data) || data[i+1] != '\n' {
			return false
		}
		j := bytes.IndexByte(data[i+1:], '\r')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return !bytes.Contains(data, []byte("\xc2\x85")) && !bytes.Contains(data, []byte("\xe2\x80\xa8")) && !bytes.Contains(data, []byte("\xe2\x80\xa9"))
}
