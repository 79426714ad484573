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
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// TempSuffix ends the names of the temporary files this package creates,
// which start with a dot; a directory owner may remove leftovers of a crash.
const TempSuffix = ".tmp"

// File is a file that appears at its final path whole or not at all: it is
// written as a temporary file in the target directory, then Install fsyncs
// it, renames it into place and fsyncs the directory. Use it when the final
// name is known only after writing (a content-addressed file).
type File struct {
	*os.File
	dir string
}

// Create creates a temporary file in dir (created if needed, mode 0755)
// named "."+prefix+"*"+TempSuffix.
func Create(dir, prefix string) (*File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("atomicfile: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+prefix+"*"+TempSuffix)
	if err != nil {
		return nil, fmt.Errorf("atomicfile: creating a temporary file in %s: %w", dir, err)
	}
	return &File{File: f, dir: dir}, nil
}

// Install makes the written bytes durable with permission bits perm and
// renames them to name inside the file's directory, replacing any file
// there. The File is closed afterwards, and removed on error.
func (f *File) Install(name string, perm os.FileMode) error {
	err := f.seal(perm)
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(f.dir, name))
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("atomicfile: installing %s in %s: %w", name, f.dir, err)
	}
	return SyncDir(f.dir)
}

// InstallNew is Install that never replaces: if name exists (a file, or a
// link, which is not followed), it fails with an error wrapping
// fs.ErrExist and leaves name as it was. The temporary file is hard-linked
// to name, which creates it exclusively, like O_CREAT|O_EXCL|O_NOFOLLOW,
// yet whole: a racing reader sees no file or the complete one. The
// temporary file is removed either way.
func (f *File) InstallNew(name string, perm os.FileMode) error {
	err := f.seal(perm)
	if err == nil {
		err = os.Link(f.Name(), filepath.Join(f.dir, name))
	}
	os.Remove(f.Name())
	if err != nil {
		return fmt.Errorf("atomicfile: creating %s in %s: %w", name, f.dir, err)
	}
	return SyncDir(f.dir)
}

// WriteNewFile creates path with b and permission bits perm as WriteFile
// does, but fails with an error wrapping fs.ErrExist when path exists
// (InstallNew): two processes creating the same file never overwrite each
// other.
func WriteNewFile(path string, b []byte, perm os.FileMode) error {
	f, err := Create(filepath.Dir(path), filepath.Base(path)+".")
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Discard()
		return fmt.Errorf("atomicfile: writing %s: %w", path, err)
	}
	return f.InstallNew(filepath.Base(path), perm)
}

// Discard closes and removes the temporary file; it is a no-op after
// Install.
func (f *File) Discard() {
	f.Close()
	os.Remove(f.Name())
}

// Write creates or replaces path with what write puts into the writer it is
// given, with permission bits perm (applied regardless of the umask). The
// directory is created if needed (mode 0755). On any error the target is
// untouched and the temporary file is removed.
func Write(path string, perm os.FileMode, write func(w io.Writer) error) error {
	f, err := Create(filepath.Dir(path), filepath.Base(path)+".")
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Discard()
		return err
	}
	return f.Install(filepath.Base(path), perm)
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
	// File systems that cannot sync a directory are not an error.
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) && !errors.Is(err, errors.ErrUnsupported) {
		return fmt.Errorf("atomicfile: syncing directory %s: %w", dir, err)
	}
	return nil
}

// seal sets the permission bits, syncs and closes the temporary file.
func (f *File) seal(perm os.FileMode) error {
	err := f.Chmod(perm)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
