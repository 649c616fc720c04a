package config

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// Logger returns the logger kl-hook uses: warnings and errors on stderr (never stdout,
// which belongs to the runtime protocol; the runtime shows a hook's stderr only when the
// hook fails) and, when logFile is set, every record at logLevel as JSON lines in that
// file. fileOnly writes to the file alone: for the final error, which the caller prints
// to stderr itself. close releases the file.
func (c *Config) Logger(prog string) (log, fileOnly *slog.Logger, close func()) {
	return c.LoggerTo(prog, slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: max(c.Level(), slog.LevelWarn)}))
}

// LoggerTo is Logger with side in the place of stderr: it gets every record it is
// enabled for, besides logFile. A nil side leaves logFile alone (and, when that cannot
// be opened, drops the records).
func (c *Config) LoggerTo(prog string, side slog.Handler) (log, fileOnly *slog.Logger, close func()) {
	var handlers []slog.Handler
	if side != nil {
		handlers = append(handlers, side)
	}
	close = func() {}
	fileOnly = Discard()
	if c.LogFile != "" {
		_ = os.MkdirAll(filepath.Dir(c.LogFile), 0o755)
		f, err := os.OpenFile(c.LogFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
		if err == nil {
			fh := slog.NewJSONHandler(f, &slog.HandlerOptions{Level: c.Level()})
			handlers = append(handlers, fh)
			fileOnly = slog.New(fh).With("prog", prog, "pid", os.Getpid())
			close = func() { f.Close() }
		} else if side != nil {
			slog.New(side).Warn("cannot open log file", "path", c.LogFile, "err", err)
		}
	}
	return slog.New(fanout(handlers)).With("prog", prog, "pid", os.Getpid()), fileOnly, close
}

// Level is logLevel as a slog level (info when unset).
func (c *Config) Level() slog.Level {
	switch strings.ToLower(c.LogLevel) {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// Discard is a logger that drops everything (tests, and before the config is known).
func Discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

type fanout []slog.Handler

func (f fanout) Enabled(ctx context.Context, l slog.Level) bool {
	for _, h := range f {
		if h.Enabled(ctx, l) {
			return true
		}
	}
	return false
}

func (f fanout) Handle(ctx context.Context, r slog.Record) error {
	for _, h := range f {
		if h.Enabled(ctx, r.Level) {
			_ = h.Handle(ctx, r.Clone())
		}
	}
	return nil
}

func (f fanout) WithAttrs(as []slog.Attr) slog.Handler {
	out := make(fanout, len(f))
	for i, h := range f {
		out[i] = h.WithAttrs(as)
	}
	return out
}

func (f fanout) WithGroup(name string) slog.Handler {
	out := make(fanout, len(f))
	for i, h := range f {
		out[i] = h.WithGroup(name)
	}
	return out
}
