package runtime

import (
	"io"
	"log/slog"
	"os"

	"github.com/kl-egress/kl/shim/config"
)

// logger returns kl-runtime's logger (see config.LoggerTo): every record at logLevel in
// logFile, and warnings and errors in the runtime log the engine asked for with --log, in
// runc's format, where containerd and dockerd look for a runtime's messages. Never on
// stderr when the engine gave --log or the operator a logFile: containerd's runc shim
// hands `runc create` and `runc exec` the container's own stdio, so kl-runtime's stderr
// is the workload's (runc itself logs to --log for that reason). With neither, as when
// kl-runtime is run by hand, warnings go to stderr rather than nowhere.
func logger(cfg *config.Config, inv Invocation) (log, fileOnly *slog.Logger, close func()) {
	side, closeSide := runcLog(inv, max(cfg.Level(), slog.LevelWarn))
	if side == nil && cfg.LogFile == "" {
		side = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: max(cfg.Level(), slog.LevelWarn)})
	}
	log, fileOnly, closeFile := cfg.LoggerTo("kl-runtime", side)
	return log, fileOnly, func() { closeFile(); closeSide() }
}

// runcLog returns a handler that appends records at level and above to inv's --log file
// the way runc writes it (logrus: "level" debug, info, warning or error; "msg"; "time";
// JSON lines with --log-format json, else logfmt), nil when there is no --log or it
// cannot be opened.
func runcLog(inv Invocation, level slog.Level) (slog.Handler, func()) {
	if inv.Log == "" {
		return nil, func() {}
	}
	f, err := os.OpenFile(inv.Log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, func() {}
	}
	return runcHandler(f, inv.LogFormat, level), func() { f.Close() }
}

func runcHandler(w io.Writer, format string, level slog.Level) slog.Handler {
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) > 0 {
			return a
		}
		switch a.Key {
		case slog.LevelKey:
			return slog.String(slog.LevelKey, logrusLevel(a.Value.Any().(slog.Level)))
		case slog.MessageKey:
			return slog.String(slog.MessageKey, "kl-runtime: "+a.Value.String())
		}
		return a
	}}
	if format == "json" {
		return slog.NewJSONHandler(w, opts)
	}
	return slog.NewTextHandler(w, opts)
}

func logrusLevel(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "error"
	case l >= slog.LevelWarn:
		return "warning"
	case l >= slog.LevelInfo:
		return "info"
	}
	return "debug"
}
