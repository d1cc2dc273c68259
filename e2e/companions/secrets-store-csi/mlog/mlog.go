// Package mlog stands in for monis.app/mlog with the few names the Secrets Store CSI driver uses.
package mlog

import (
	"context"
	"fmt"
	"os"
)

// LogFormat names an output format; only the text format is produced.
type LogFormat string

const (
	FormatText LogFormat = "text"
	FormatJSON LogFormat = "json"
)

// Setup returns the flush the driver defers; nothing is buffered here.
func Setup() func() { return func() {} }

// ValidateAndSetKlogLevelAndFormatGlobally accepts the driver's klog level and format as they are.
func ValidateAndSetKlogLevelAndFormatGlobally(_ context.Context, _ any, _ LogFormat) error {
	return nil
}

// Error logs a message and its error to stderr.
func Error(msg string, err error, keysAndValues ...any) {
	fmt.Fprintln(os.Stderr, append([]any{"error:", msg, err}, keysAndValues...)...)
}

// Fatal logs the error and exits non-zero.
func Fatal(err error, keysAndValues ...any) {
	fmt.Fprintln(os.Stderr, append([]any{"fatal:", err}, keysAndValues...)...)
	os.Exit(1)
}
