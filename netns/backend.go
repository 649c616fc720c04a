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
	if d := Diff(c.Program(), got); len(d) > 0 {
		return &VerifyError{NS: nsPath, Diffs: d}
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
