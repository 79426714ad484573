package sim

import "errors"

// Sentinel errors. Every error this package returns wraps one of these with
// %w and names the offending field and value; callers test with errors.Is.
var (
	// ErrConfig reports a configuration field out of range.
	ErrConfig = errors.New("sim: invalid config")
	// ErrNetwork reports a network description that is inconsistent: an
	// unknown region, a duplicate node ID, a latency or bandwidth that is not
	// a finite positive number, a latency matrix of the wrong shape.
	ErrNetwork = errors.New("sim: invalid network")
	// ErrTooLarge reports an input (file, node or region count) beyond the
	// package's limits; it is returned before anything of that size is
	// allocated.
	ErrTooLarge = errors.New("sim: input too large")
	// ErrJob reports a job that cannot run on its network: a task on a node
	// that does not exist, a negative work or size.
	ErrJob = errors.New("sim: invalid job")
)
