package netns

import (
	"slices"
	"sync"
)

// Fake is an in-memory Backend for unit tests: it keeps the last table applied per netns
// path, and reports errors set in ApplyErr. Its methods are safe for concurrent use; read
// the fields directly only when no call is running.
type Fake struct {
	mu       sync.Mutex
	Tables   map[string]*Table // by netns path
	Applied  int               // number of successful Apply calls
	ApplyErr error
}

// NewFake returns an empty fake backend.
func NewFake() *Fake { return &Fake{Tables: map[string]*Table{}} }

var _ Backend = (*Fake)(nil)

// Apply records t (a deep copy) for nsPath.
func (f *Fake) Apply(nsPath string, t *Table) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ApplyErr != nil {
		return f.ApplyErr
	}
	f.Tables[nsPath] = cloneTable(t)
	f.Applied++
	return nil
}

// Delete forgets nsPath's table.
func (f *Fake) Delete(nsPath, table string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t, ok := f.Tables[nsPath]; ok && t.Name == table {
		delete(f.Tables, nsPath)
	}
	return nil
}

// Get returns a copy of the recorded table or ErrNoTable.
func (f *Fake) Get(nsPath, table string) (*Table, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.Tables[nsPath]
	if !ok || t.Name != table {
		return nil, ErrNoTable
	}
	return cloneTable(t), nil
}

func cloneTable(t *Table) *Table {
	c := &Table{Name: t.Name}
	for _, s := range t.Sets {
		s.Addrs = slices.Clone(s.Addrs)
		s.Ports = slices.Clone(s.Ports)
		s.PortRanges = slices.Clone(s.PortRanges)
		s.Marks = slices.Clone(s.Marks)
		c.Sets = append(c.Sets, s)
	}
	for _, ch := range t.Chains {
		rules := make([]Rule, len(ch.Rules))
		for i, r := range ch.Rules {
			rules[i] = Rule{Match: slices.Clone(r.Match), Action: r.Action}
		}
		ch.Rules = rules
		c.Chains = append(c.Chains, ch)
	}
	return c
}
