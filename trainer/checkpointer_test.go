package trainer

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
)

func ckStage(t testing.TB, c model.Config) *model.Stage {
	t.Helper()
	s, err := model.NewStage(kernels.NewCPU(1), c, model.FullSpec(c), 1, 8, 1)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Background saves write what the stage held at Save, one at a time, and
// reuse their buffers; the last one is on disk after Wait.
func TestCheckpointerSaves(t *testing.T) {
	c := model.Config{Name: "micro", Vocab: 256, PaddedVocab: 256, MaxT: 8, C: 16, Layers: 1, Heads: 2}
	s := ckStage(t, c)
	path := filepath.Join(t.TempDir(), "ck.safetensors")
	cp := NewCheckpointer(path)
	w := make([]float32, s.NumParams())
	for step := 1; step <= 5; step++ {
		for i := range w {
			w[i] = float32(step)
		}
		s.Device().CopyIn(s.Params, w) // training moves on while the last write runs
		if err := cp.Save(s, step, map[string]string{"k": "v"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cp.Wait(); err != nil {
		t.Fatal(err)
	}
	ck, err := model.LoadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	if ck.Step != 5 || ck.Params[0] != 5 || ck.Params[len(ck.Params)-1] != 5 || ck.Meta["k"] != "v" {
		t.Fatalf("step %d, params %v..%v, meta %v", ck.Step, ck.Params[0], ck.Params[len(ck.Params)-1], ck.Meta)
	}
	if _, _, n := cp.Stats(); n != 5 {
		t.Fatalf("%d saves counted", n)
	}
	// A write that fails is reported by the next Save (or Wait).
	notDir := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	bad := NewCheckpointer(filepath.Join(notDir, "ck.safetensors"))
	if err := bad.Save(s, 1, nil); err != nil {
		t.Fatalf("the first save reports nothing yet: %v", err)
	}
	if err := bad.Wait(); err == nil {
		t.Fatal("a write under a file (not a directory) reported no error")
	}
	if err := bad.Wait(); err != nil {
		t.Fatalf("an error is reported once: %v", err)
	}
}

// A process killed while a background checkpoint is being written leaves
// the previous checkpoint, loadable. The test runs itself as the child:
// it saves step 1 and waits, starts step 2's write (a few hundred MB) and
// says so once the temporary file holds some of it; the parent kills it
// with SIGKILL at once.
func TestCheckpointerCrashLeavesPrevious(t *testing.T) {
	if dir := os.Getenv("SKEIN_CKPT_CRASH_DIR"); dir != "" {
		crashChild(t, dir)
		return
	}
	if testing.Short() {
		t.Skip("writes a few hundred MB")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCheckpointerCrashLeavesPrevious$", "-test.v")
	cmd.Env = append(os.Environ(), "SKEIN_CKPT_CRASH_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	started := false
	finished := false
	for sc.Scan() {
		if strings.Contains(sc.Text(), "second write in flight") {
			started = true
			break
		}
		if finished = strings.Contains(sc.Text(), "second write finished"); finished {
			break
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	if finished {
		t.Skip("this disk wrote the second checkpoint before its temporary file could be seen: nothing to interrupt")
	}
	if !started {
		t.Fatal("the child did not get to its second write")
	}
	ck, err := model.LoadCheckpoint(filepath.Join(dir, "ck.safetensors"))
	if err != nil {
		t.Fatalf("the previous checkpoint is not loadable after the crash: %v", err)
	}
	if ck.Step != 1 {
		t.Fatalf("step %d on disk: the second write finished before the kill, so the test proved nothing", ck.Step)
	}
}

func crashChild(t *testing.T, dir string) {
	c := model.Config{Name: "big", Vocab: 256, PaddedVocab: 256, MaxT: 8, C: 768, Layers: 2, Heads: 8}
	s := ckStage(t, c)
	cp := NewCheckpointer(filepath.Join(dir, "ck.safetensors"))
	if err := cp.Save(s, 1, nil); err != nil {
		t.Fatal(err)
	}
	if err := cp.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := cp.Save(s, 2, nil); err != nil {
		t.Fatal(err)
	}
	// Until the second write's temporary file has bytes in it.
	done := cp.done
	for partial := false; !partial; {
		select {
		case <-done:
			os.Stdout.WriteString("second write finished before it was seen\n")
			select {}
		case <-time.After(time.Millisecond):
		}
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if info, err := e.Info(); err == nil && e.Name() != "ck.safetensors" && info.Size() > 0 {
				partial = true
			}
		}
	}
	os.Stdout.WriteString("second write in flight\n")
	cp.Wait()
	select {} // the parent kills this process
}

// BenchmarkCheckpointStall is how long a training loop waits per
// checkpoint of the gpt2 preset (124M parameters: weights and both AdamW
// moments, 1.5 GB): writing it synchronously (the loop waits for the
// encoding, the write and the fsync) against the background Checkpointer
// (the loop waits for the copy to host memory; the write overlaps the next
// steps, which take far longer than it). Set SKEIN_BENCH_DIR to a directory
// on the disk to measure (default: the test's temporary directory).
//
//	go test ./trainer -run '^$' -bench CheckpointStall -benchtime 3x
func BenchmarkCheckpointStall(b *testing.B) {
	c, err := model.Preset("gpt2")
	if err != nil {
		b.Fatal(err)
	}
	s := ckStage(b, c)
	dir := os.Getenv("SKEIN_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	path := filepath.Join(dir, "bench-ck.safetensors")
	defer os.Remove(path)
	b.Run("sync", func(b *testing.B) {
		for range b.N {
			if err := model.SaveCheckpoint(path, s.Snapshot(1, nil)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("background", func(b *testing.B) {
		cp := NewCheckpointer(path)
		for range b.N {
			if err := cp.Save(s, 1, nil); err != nil {
				b.Fatal(err)
			}
			b.StopTimer() // the next steps run while it writes
			if err := cp.Wait(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
}
