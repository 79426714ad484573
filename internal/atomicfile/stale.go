package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// processStart is when this process loaded the package: a temporary file
// older than that cannot belong to a write of this process.
var processStart = time.Now()

// ProcessStart returns when this process started (when it loaded this
// package), the cut-off for RemoveStale.
func ProcessStart() time.Time { return processStart }

// tempName matches the names Create gives: "." + prefix + the decimal
// random part of os.CreateTemp + TempSuffix.
var tempName = regexp.MustCompile(`^\..*[0-9]+` + regexp.QuoteMeta(TempSuffix) + `$`)

// IsTemp reports whether name (a base name) is one this package gives its
// temporary files.
func IsTemp(name string) bool { return tempName.MatchString(name) }

// RemoveStale deletes the temporary files of this package that a crash left
// in dir: regular files (never links or directories) named as Create names
// them and last modified before the cut-off, typically ProcessStart(), so
// that a write in progress is never touched. It returns the paths removed;
// a missing dir holds nothing stale. Subdirectories are not visited.
func RemoveStale(dir string, before time.Time) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("atomicfile: listing %s: %w", dir, err)
	}
	var removed []string
	for _, e := range entries {
		if !e.Type().IsRegular() || !IsTemp(e.Name()) {
			continue
		}
		fi, err := e.Info()
		if err != nil || !fi.ModTime().Before(before) {
			continue // gone meanwhile, or written since the cut-off
		}
		p := filepath.Join(dir, e.Name())
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("atomicfile: removing stale %s: %w", p, err)
		}
		removed = append(removed, p)
	}
	return removed, nil
}
