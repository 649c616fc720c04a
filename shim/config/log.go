package config

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// Logger returns the logger kl-runtime and kl-hook use: warnings and errors on stderr
// (never stdout, which belongs to the runtime protocol) and, when logFile is set, every
// record at logLevel as JSON lines in that file. fileOnly writes to the file alone: for
// the final error, which the caller prints to stderr itself. close releases the file.
func (c *Config) Logger(prog string) (log, fileOnly *slog.Logger, close func()) {
	level := slog.LevelInfo
	switch strings.ToLower(c.LogLevel) {
	case "debug":
		level = slog.LevelDebug
	case "warn":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	}
	handlers := []slog.Handler{slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: max(level, slog.LevelWarn)})}
	close = func() {}
	fileOnly = Discard()
	if c.LogFile != "" {
		_ = os.MkdirAll(filepath.Dir(c.LogFile), 0o755)
		f, err := os.OpenFile(c.LogFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
		if err == nil {
			fh := slog.NewJSONHandler(f, &slog.HandlerOptions{Level: level})
			handlers = append(handlers, fh)
			fileOnly = slog.New(fh).With("prog", prog, "pid", os.Getpid())
			close = func() { f.Close() }
		} else {
			slog.New(handlers[0]).Warn("cannot open log file", "path", c.LogFile, "err", err)
		}
	}
	return slog.New(fanout(handlers)).With("prog", prog, "pid", os.Getpid()), fileOnly, close
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
