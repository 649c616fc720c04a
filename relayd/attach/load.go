package attach

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/kl-egress/kl/relayd/config"
)

// DefaultSettingsPath is where kl-relayd looks for the attach listener's settings. It is
// a file of its own, readable by root only, since it holds tokens.
const DefaultSettingsPath = "/etc/kl/attach.yaml"

// LoadSettings reads the attach listener's settings. A missing file is "no listener"
// (nil, nil) unless required (the operator named it). A file with tokens that others can
// read is refused, as are unknown keys and invalid settings.
func LoadSettings(path string, required bool) (*Settings, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !required {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("attach settings: %w", err)
	}
	s, err := ParseSettings(path, data)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 && s.hasTokens() {
		return nil, fmt.Errorf("attach settings %s: holds tokens but its mode is %v; make it readable by root only (chmod 600)", path, fi.Mode().Perm())
	}
	return s, nil
}

// ParseSettings decodes and validates settings held in memory (name is for messages).
func ParseSettings(name string, data []byte) (*Settings, error) {
	s := &Settings{}
	if err := config.DecodeOne(data, s); err != nil {
		return nil, fmt.Errorf("attach settings %s: %w", name, err)
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("attach settings %s: %w", name, err)
	}
	return s, nil
}

func (s *Settings) hasTokens() bool {
	for _, c := range s.Credentials {
		if c.Token != "" {
			return true
		}
	}
	return false
}
