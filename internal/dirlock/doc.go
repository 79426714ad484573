// Package dirlock gives one process at a time a data directory: a second
// `skein node join` (or bootstrap) on the same directory is refused at once
// instead of clashing identities and writing the same checkpoint.
//
// It owns the lock file and nothing else in the directory. The lock is an
// advisory flock(2) on <dir>/lock, released by the kernel when the process
// exits, however it exits, so a crash never leaves a stale lock. Outside
// Unix there is no lock (documented there, not silently pretended).
package dirlock
