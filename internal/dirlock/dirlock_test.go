//go:build unix

package dirlock

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestSecondAcquireRefusedUntilRelease(t *testing.T) {
	dir := t.TempDir()
	a, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	// flock locks belong to the open file description, so a second Acquire
	// in the same process is refused too, as another process would be.
	if _, err := Acquire(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Acquire: %v, want ErrLocked", err)
	} else if !strings.Contains(err.Error(), dir) {
		t.Fatalf("error %q does not name the directory", err)
	}
	if err := a.Release(); err != nil {
		t.Fatal(err)
	}
	b, err := Acquire(dir)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	b.Release()
}

// A lock held by another process (flock(1)) is refused.
func TestLockHeldByAnotherProcess(t *testing.T) {
	flock, err := exec.LookPath("flock")
	if err != nil {
		t.Skip("flock(1) not installed")
	}
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/lock", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(flock, "-x", dir+"/lock", "sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	for i := 0; ; i++ {
		l, err := Acquire(dir)
		if errors.Is(err, ErrLocked) {
			return
		}
		if err == nil {
			l.Release()
		}
		if i == 200 {
			t.Fatalf("lock held by flock(1) was never refused: %v", err)
		}
		exec.Command("sleep", "0.01").Run()
	}
}
