//go:build !unix

package dirlock

import (
	"errors"
	"fmt"
	"os"
)

// ErrLocked is returned (wrapped) when another process holds the directory.
var ErrLocked = errors.New("dirlock: data directory in use by another process")

// Lock holds a directory until Release.
type Lock struct{}

// Acquire creates dir if needed. There is no flock(2) here: two processes
// on one directory are not detected on this platform.
func Acquire(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("dirlock: %w", err)
	}
	return &Lock{}, nil
}

// Release does nothing; it is safe to call on a nil Lock.
func (l *Lock) Release() error { return nil }
