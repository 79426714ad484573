package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFileReplacesAndSetsMode(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sub", "f")
	for _, c := range []struct {
		body string
		perm os.FileMode
	}{{"first", 0o644}, {"second, longer", 0o600}} {
		if err := WriteFile(p, []byte(c.body), c.perm); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != c.body {
			t.Fatalf("read %q, %v; want %q", got, err, c.body)
		}
		fi, _ := os.Stat(p)
		if fi.Mode().Perm() != c.perm {
			t.Fatalf("mode %v, want %v", fi.Mode().Perm(), c.perm)
		}
	}
	left, _ := os.ReadDir(filepath.Join(dir, "sub"))
	if len(left) != 1 {
		t.Fatalf("temporary files left behind: %v", left)
	}
}

func TestFailedWriteKeepsOldFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := Write(p, 0o644, func(w io.Writer) error {
		w.Write([]byte("partial new cont"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	got, _ := os.ReadFile(p)
	if string(got) != "old" {
		t.Fatalf("target changed to %q", got)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 1 {
		t.Fatalf("temporary files left behind: %v", left)
	}
}
