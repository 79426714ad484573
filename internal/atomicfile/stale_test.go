package atomicfile

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// RemoveStale removes only this package's temporary files older than the
// cut-off: not a write in progress, not other files, not links.
func TestRemoveStale(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-time.Hour)
	write := func(name string, mod time.Time) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mod, mod); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A real leftover: a temporary file made by Create, then aged.
	f, err := Create(dir, "checkpoint.safetensors.")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(f.Name(), old, old); err != nil {
		t.Fatal(err)
	}
	stale := []string{f.Name(), write(".peers.json.123.tmp", old)}
	kept := []string{
		write(".state.456.tmp", time.Now().Add(time.Minute)), // written after the cut-off
		write("notes.tmp", old),                              // not hidden: not ours
		write(".cache.tmp", old),                             // no random part: not ours
		write(".pack-1.tmp.bak", old),                        // another suffix
		write("checkpoint.safetensors", old),
	}
	link := filepath.Join(dir, ".link-9.tmp")
	if err := os.Symlink(kept[4], link); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, link)
	if err := os.Mkdir(filepath.Join(dir, ".dir-7.tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, filepath.Join(dir, ".dir-7.tmp"))

	removed, err := RemoveStale(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	slices.Sort(stale)
	if !slices.Equal(removed, stale) {
		t.Fatalf("removed %v, want %v", removed, stale)
	}
	for _, p := range stale {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s still there: %v", p, err)
		}
	}
	for _, p := range kept {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s removed: %v", p, err)
		}
	}
	if got, err := RemoveStale(filepath.Join(dir, "absent"), time.Now()); err != nil || got != nil {
		t.Fatalf("missing directory: %v, %v", got, err)
	}
}
