package netns

import (
	"errors"
	"fmt"
)

// ErrNoTable is returned by Backend.Get when the netns has no kl table.
var ErrNoTable = errors.New("no kl table")

// Backend applies, reads back and deletes one netns's kl table. The real one speaks
// nf_tables netlink (google/nftables) inside the netns; Fake records tables in memory for
// unit tests of code built on this package.
type Backend interface {
	// Apply replaces the table t.Name in nsPath with t in one atomic transaction.
	Apply(nsPath string, t *Table) error
	// Delete removes the table; nil when it or the netns does not exist.
	Delete(nsPath, table string) error
	// Get reads the table back from the kernel in the Table form (ErrNoTable when absent),
	// and Diff compares it with a wanted table: one line per difference.
	Get(nsPath, table string) (*Table, error)
}

// defaultBackend is the backend the package-level functions use.
var defaultBackend Backend = nftBackend{}

// Install validates c and replaces the netns's kl table with c's program in one atomic
// transaction (the table is deleted and recreated in the same batch, so a reinstall never
// leaves a window without capture).
func Install(nsPath string, c Capture) error { return InstallWith(defaultBackend, nsPath, c) }

// Remove deletes the kl table. It is idempotent: nil when the table or the netns is gone.
func Remove(nsPath string) error { return RemoveWith(defaultBackend, nsPath) }

// Verify reads the kl table back and returns an error naming every set, chain and rule that
// is missing, different or unexpected compared with c's program.
func Verify(nsPath string, c Capture) error { return VerifyWith(defaultBackend, nsPath, c) }

// errNoPath refuses an empty netns path: for the nftables functions it would silently mean
// the caller's own (the host's) netns.
var errNoPath = errors.New("netns path is empty (use /proc/self/ns/net to mean the current one)")

// InstallWith is Install on a given backend.
func InstallWith(b Backend, nsPath string, c Capture) error {
	if nsPath == "" {
		return fmt.Errorf("install nftables table inet %s: %w", TableName, errNoPath)
	}
	if err := c.Validate(); err != nil {
		return err
	}
	if err := b.Apply(nsPath, c.Program()); err != nil {
		return fmt.Errorf("install nftables table inet %s in %s: %w", TableName, nsPath, err)
	}
	return nil
}

// RemoveWith is Remove on a given backend.
func RemoveWith(b Backend, nsPath string) error {
	if nsPath == "" {
		return fmt.Errorf("remove nftables table inet %s: %w", TableName, errNoPath)
	}
	if err := b.Delete(nsPath, TableName); err != nil {
		return fmt.Errorf("remove nftables table inet %s in %s: %w", TableName, nsPath, err)
	}
	return nil
}

// VerifyWith is Verify on a given backend.
func VerifyWith(b Backend, nsPath string, c Capture) error {
	if nsPath == "" {
		return fmt.Errorf("verify nftables table inet %s: %w", TableName, errNoPath)
	}
	if err := c.Validate(); err != nil {
		return err
	}
	got, err := b.Get(nsPath, TableName)
	if err != nil {
		return fmt.Errorf("verify nftables table inet %s in %s: %w", TableName, nsPath, err)
	}
	if d := Diff(c.Program(), c.withoutDecisions(got)); len(d) > 0 {
		return &VerifyError{NS: nsPath, Diffs: d}
	}
	return nil
}

// InstallDecisions replaces the netns's kl table with c's program carrying the kernel
// decisions d, in one atomic transaction: packets see the old table or the new one,
// never a mixture, and established connections keep flowing (their conntrack entries
// and marks are untouched; nat rules only see a connection's first packet).
func InstallDecisions(nsPath string, c Capture, d Decisions) error {
	return InstallDecisionsWith(defaultBackend, nsPath, c, d)
}

// VerifyDecisions is Verify for a table installed with InstallDecisions: it compares
// the whole program, decisions included. (Verify checks only the capture underneath
// and accepts any decisions, so that CNI CHECK, which does not know them, still works.)
func VerifyDecisions(nsPath string, c Capture, d Decisions) error {
	return VerifyDecisionsWith(defaultBackend, nsPath, c, d)
}

// InstallDecisionsWith is InstallDecisions on a given backend.
func InstallDecisionsWith(b Backend, nsPath string, c Capture, d Decisions) error {
	if nsPath == "" {
		return fmt.Errorf("install nftables table inet %s: %w", TableName, errNoPath)
	}
	if err := c.Validate(); err != nil {
		return err
	}
	t, err := c.ProgramWith(d)
	if err != nil {
		return err
	}
	if err := b.Apply(nsPath, t); err != nil {
		return fmt.Errorf("install nftables table inet %s with kernel decisions in %s: %w", TableName, nsPath, err)
	}
	return nil
}

// VerifyDecisionsWith is VerifyDecisions on a given backend.
func VerifyDecisionsWith(b Backend, nsPath string, c Capture, d Decisions) error {
	if nsPath == "" {
		return fmt.Errorf("verify nftables table inet %s: %w", TableName, errNoPath)
	}
	if err := c.Validate(); err != nil {
		return err
	}
	want, err := c.ProgramWith(d)
	if err != nil {
		return err
	}
	got, err := b.Get(nsPath, TableName)
	if err != nil {
		return fmt.Errorf("verify nftables table inet %s in %s: %w", TableName, nsPath, err)
	}
	if diff := Diff(want, got); len(diff) > 0 {
		return &VerifyError{NS: nsPath, Diffs: diff}
	}
	return nil
}

// VerifyError lists what differs between the wanted and the installed table.
type VerifyError struct {
	NS    string
	Diffs []string
}

func (e *VerifyError) Error() string {
	s := fmt.Sprintf("nftables table inet %s in %s differs from the capture program:", TableName, e.NS)
	for _, d := range e.Diffs {
		s += "\n  " + d
	}
	return s
}

// InstallProgram applies a table built by Capture.ProgramWith (or Program) in one atomic
// transaction. It lets a caller that installs the same program into many pods (a rules
// reload across a node) build it once.
func InstallProgram(nsPath string, t *Table) error {
	return InstallProgramWith(defaultBackend, nsPath, t)
}

// InstallProgramWith is InstallProgram on a given backend.
func InstallProgramWith(b Backend, nsPath string, t *Table) error {
	if nsPath == "" {
		return fmt.Errorf("install nftables table inet %s: %w", TableName, errNoPath)
	}
	if t == nil || t.Name != TableName {
		return fmt.Errorf("install nftables table in %s: not a kl program", nsPath)
	}
	if err := b.Apply(nsPath, t); err != nil {
		return fmt.Errorf("install nftables table inet %s in %s: %w", TableName, nsPath, err)
	}
	return nil
}
