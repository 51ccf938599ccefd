package runtime

import (
	"io"
	"log/slog"
)

// NewLogger returns a logger writing lines of the given format at level and
// above to w.
func NewLogger(w io.Writer, level slog.Level, format LogFormat) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == LogJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
