package data

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/skein-ml/skein/internal/atomicfile"
)

// removeTempFiles deletes the leftovers of atomic writes in dir that a crash
// interrupted.
func removeTempFiles(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("data: listing %s: %w", dir, err)
	}
	for _, e := range entries {
		if n := e.Name(); e.Type().IsRegular() && strings.HasPrefix(n, ".") && strings.HasSuffix(n, atomicfile.TempSuffix) {
			os.Remove(filepath.Join(dir, n))
		}
	}
	return nil
}
