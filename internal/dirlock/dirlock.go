//go:build unix

package dirlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ErrLocked is returned (wrapped) when another process holds the directory.
var ErrLocked = errors.New("dirlock: data directory in use by another process")

// Lock holds a directory until Release.
type Lock struct{ f *os.File }

// Acquire creates dir if needed and locks it without waiting. The error for
// a held lock names the directory and, when known, the holder's process id.
func Acquire(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("dirlock: %w", err)
	}
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("dirlock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b := make([]byte, 32)
		n, _ := f.ReadAt(b, 0)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := strings.TrimSpace(string(b[:n]))
			if _, perr := strconv.Atoi(holder); perr == nil {
				return nil, fmt.Errorf("%w: %s (process %s); give each process its own --data-dir", ErrLocked, dir, holder)
			}
			return nil, fmt.Errorf("%w: %s; give each process its own --data-dir", ErrLocked, dir)
		}
		return nil, fmt.Errorf("dirlock: locking %s: %w", path, err)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return &Lock{f: f}, nil
}

// Release unlocks the directory. It is safe to call on a nil Lock.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the descriptor drops the flock
	l.f = nil
	return err
}
