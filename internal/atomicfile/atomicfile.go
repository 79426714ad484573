// Package atomicfile writes a file so that a crash at any moment leaves
// either the old file or the new one, never a mix or a truncated file: the
// bytes go to a temporary file in the same directory, which is fsynced,
// renamed over the target, and then the directory is fsynced so the rename
// itself survives a power loss.
//
// It owns that one sequence and nothing else: callers choose the contents,
// the mode and the directory.
package atomicfile

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Write creates or replaces path with what write puts into the writer it is
// given, with permission bits perm (applied regardless of the umask). The
// directory is created if needed (mode 0755). On any error the target is
// untouched and the temporary file is removed.
func Write(path string, perm os.FileMode, write func(w io.Writer) error) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("atomicfile: %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("atomicfile: syncing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("atomicfile: closing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("atomicfile: installing %s: %w", path, err)
	}
	return SyncDir(dir)
}

// WriteFile is Write for bytes already in memory.
func WriteFile(path string, b []byte, perm os.FileMode) error {
	return Write(path, perm, func(w io.Writer) error {
		if _, err := w.Write(b); err != nil {
			return fmt.Errorf("atomicfile: writing %s: %w", path, err)
		}
		return nil
	})
}

// SyncDir fsyncs a directory, making renames and creations in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("atomicfile: syncing directory %s: %w", dir, err)
	}
	return nil
}
