package atomicfile

import (
	"errors"
	"io"
	"io/fs"
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

// WriteNewFile never replaces a file or a link, and leaves no temporary file.
func TestWriteNewFileIsExclusive(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "key")
	if err := WriteNewFile(p, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteNewFile(p, []byte("second"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second create: %v, want fs.ErrExist", err)
	}
	if got, _ := os.ReadFile(p); string(got) != "first" {
		t.Fatalf("file now %q", got)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode().Perm())
	}
	target := filepath.Join(dir, "target")
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := WriteNewFile(link, []byte("x"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("create through a dangling link: %v, want fs.ErrExist", err)
	}
	if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the link was followed: %v", err)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 2 {
		t.Fatalf("entries %v, want key and link", left)
	}
}
