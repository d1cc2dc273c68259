// A stand-in for monis.app/mlog, the logging helper the Secrets Store CSI driver's main package imports
// and the Go module proxy here does not serve. The driver logs through klog either way; this keeps its
// defaults (text format, klog's own verbosity flag).
module monis.app/mlog

go 1.22
