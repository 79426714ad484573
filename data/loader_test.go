package data

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// smallCorpus is a random-content corpus in a temporary directory.
func smallCorpus(t testing.TB, nfiles, maxSize int) *Corpus {
	t.Helper()
	return openCorpus(t, CorpusConfig{Paths: []string{writeCorpus(t, randomFiles(nfiles, maxSize, 9))}, ValFraction: 0.25})
}

func newLoader(t testing.TB, c *Corpus, s Split, cfg LoaderConfig) *Loader {
	t.Helper()
	l, err := NewLoader(c, s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func batch(t testing.TB, l *Loader, step int) (in, tg []int32) {
	t.Helper()
	cfg := l.Config()
	in, tg = make([]int32, cfg.B*cfg.T), make([]int32, cfg.B*cfg.T)
	if err := l.Batch(step, in, tg); err != nil {
		t.Fatal(err)
	}
	return in, tg
}

func TestBatchMatchesWindowsAndShifts(t *testing.T) {
	c := smallCorpus(t, 30, 400)
	for _, s := range []Split{Train, Validation} {
		for _, cfg := range []LoaderConfig{
			{Seed: 1, Workers: 1, B: 1, T: 1},
			{Seed: 2, Workers: 3, Worker: 2, B: 4, T: 16},
			{Seed: 3, Workers: 2, Worker: 0, B: 3, T: 63},
		} {
			t.Run(fmt.Sprintf("%v/%+v", s, cfg), func(t *testing.T) {
				stream := streamOf(t, c, s)
				l := newLoader(t, c, s, cfg)
				if want := uint64(len(stream) / (cfg.T + 1)); l.Windows() != want {
					t.Fatalf("Windows = %d, want %d", l.Windows(), want)
				}
				for step := range 2*int(l.StepsPerEpoch()) + 1 {
					in, tg := batch(t, l, step)
					for b := range cfg.B {
						w, _ := l.Window(step, b)
						win := stream[int(w)*(cfg.T+1):][:cfg.T+1]
						for i := range cfg.T {
							if in[b*cfg.T+i] != int32(win[i]) || tg[b*cfg.T+i] != int32(win[i+1]) {
								t.Fatalf("step %d seq %d pos %d: (in, tg) = (%d, %d), window %d has (%d, %d)",
									step, b, i, in[b*cfg.T+i], tg[b*cfg.T+i], w, win[i], win[i+1])
							}
							if i+1 < cfg.T && tg[b*cfg.T+i] != in[b*cfg.T+i+1] {
								t.Fatalf("step %d seq %d: targets are not inputs shifted by one at %d", step, b, i)
							}
						}
					}
				}
			})
		}
	}
}

func TestBatchDeterministic(t *testing.T) {
	c := smallCorpus(t, 30, 400)
	base := LoaderConfig{Seed: 5, Workers: 4, Worker: 1, B: 4, T: 32}
	in0, tg0 := batch(t, newLoader(t, c, Train, base), 3)

	// A fresh loader, and one that has visited other steps and epochs first.
	fresh := newLoader(t, c, Train, base)
	used := newLoader(t, c, Train, base)
	batch(t, used, 1000)
	batch(t, used, 0)
	for name, l := range map[string]*Loader{"fresh": fresh, "used": used} {
		in, tg := batch(t, l, 3)
		if !slices.Equal(in, in0) || !slices.Equal(tg, tg0) {
			t.Errorf("%s loader: batch of step 3 differs", name)
		}
	}

	other := func(f func(*LoaderConfig)) LoaderConfig { c := base; f(&c); return c }
	tests := []struct {
		name  string
		cfg   LoaderConfig
		split Split
		step  int
	}{
		{"other step", base, Train, 4},
		{"other seed", other(func(c *LoaderConfig) { c.Seed = 6 }), Train, 3},
		{"other worker", other(func(c *LoaderConfig) { c.Worker = 2 }), Train, 3},
		{"other split", base, Validation, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, _ := batch(t, newLoader(t, c, tt.split, tt.cfg), tt.step)
			if slices.Equal(in, in0) {
				t.Fatal("batch equals the base batch")
			}
		})
	}
}

func TestWorkersDisjointWithinEpoch(t *testing.T) {
	c := smallCorpus(t, 40, 300)
	for _, tt := range []struct{ workers, B, T int }{{1, 1, 7}, {3, 2, 7}, {4, 5, 3}, {7, 3, 31}} {
		t.Run(fmt.Sprintf("M=%d/B=%d/T=%d", tt.workers, tt.B, tt.T), func(t *testing.T) {
			loaders := make([]*Loader, tt.workers)
			for w := range loaders {
				loaders[w] = newLoader(t, c, Train, LoaderConfig{Seed: 11, Workers: tt.workers, Worker: w, B: tt.B, T: tt.T})
			}
			W := loaders[0].Windows()
			seen := map[uint64]map[uint64]string{} // epoch -> window -> who
			steps := int(3 * loaders[0].StepsPerEpoch())
			for step := range steps {
				for w, l := range loaders {
					for b := range tt.B {
						win, epoch := l.Window(step, b)
						if win >= W {
							t.Fatalf("window %d out of range [0, %d)", win, W)
						}
						if seen[epoch] == nil {
							seen[epoch] = map[uint64]string{}
						}
						who := fmt.Sprintf("worker %d step %d seq %d", w, step, b)
						if prev, dup := seen[epoch][win]; dup {
							t.Fatalf("epoch %d: window %d drawn by %s and %s", epoch, win, prev, who)
						}
						seen[epoch][win] = who
					}
				}
			}
			// Every full epoch covers every window.
			if len(seen[0]) != int(W) || len(seen[1]) != int(W) {
				t.Fatalf("epochs 0 and 1 drew %d and %d of %d windows", len(seen[0]), len(seen[1]), W)
			}
			// The order changes between epochs.
			order := func(epoch uint64) []uint64 {
				p := NewPermutation(W, 11, epoch)
				out := make([]uint64, W)
				for i := range out {
					out[i] = p.At(uint64(i))
				}
				return out
			}
			if W > 3 && slices.Equal(order(0), order(1)) {
				t.Fatal("epochs 0 and 1 use the same order")
			}
		})
	}
}

func TestValidationLoader(t *testing.T) {
	c := smallCorpus(t, 30, 400)
	v1, err := NewValidationLoader(c, 2, 16)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := NewValidationLoader(c, 2, 16)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := v1.Config(); cfg.Seed != ValidationSeed || cfg.Workers != 1 {
		t.Fatalf("validation config = %+v", cfg)
	}
	for step := range 5 {
		a, _ := batch(t, v1, step)
		b, _ := batch(t, v2, step)
		if !slices.Equal(a, b) {
			t.Fatalf("validation batch %d differs between loaders", step)
		}
	}
	// Validation windows come from validation files only.
	val := streamOf(t, c, Validation)
	in, _ := batch(t, v1, 0)
	w, _ := v1.Window(0, 0)
	for i := range 16 {
		if in[i] != int32(val[int(w)*17+i]) {
			t.Fatal("validation batch is not read from the validation split")
		}
	}
	// With random contents, 16 validation bytes never appear in training.
	if bytes.Contains(streamOf(t, c, Train), val[int(w)*17:][:16]) {
		t.Fatal("validation window found in the training stream")
	}
}

func TestLoaderConfigErrors(t *testing.T) {
	c := smallCorpus(t, 10, 100)
	good := LoaderConfig{Seed: 1, Workers: 2, Worker: 1, B: 2, T: 8}
	with := func(f func(*LoaderConfig)) LoaderConfig { c := good; f(&c); return c }
	tests := []struct {
		name  string
		cfg   LoaderConfig
		want  error
		field string
	}{
		{"Workers 0", with(func(c *LoaderConfig) { c.Workers = 0 }), ErrInvalidConfig, "Workers"},
		{"Worker negative", with(func(c *LoaderConfig) { c.Worker = -1 }), ErrInvalidConfig, "Worker"},
		{"Worker = Workers", with(func(c *LoaderConfig) { c.Worker = 2 }), ErrInvalidConfig, "Worker = 2"},
		{"B 0", with(func(c *LoaderConfig) { c.B = 0 }), ErrInvalidConfig, "B = 0"},
		{"T negative", with(func(c *LoaderConfig) { c.T = -3 }), ErrInvalidConfig, "T = -3"},
		{"B*T huge", with(func(c *LoaderConfig) { c.B, c.T = 1<<20, 1<<20 }), ErrInvalidConfig, "B*T"},
		{"T too long", with(func(c *LoaderConfig) { c.T = 1 << 20 }), ErrCorpusTooSmall, "T+1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := NewLoader(c, Train, tt.cfg)
			if !errors.Is(err, tt.want) || l != nil {
				t.Fatalf("NewLoader = %v, %v; want %v", l, err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("error %q does not name %q", err, tt.field)
			}
		})
	}
	if _, err := NewLoader(nil, Train, good); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil corpus: %v", err)
	}
	if _, err := NewLoader(c, Split(7), good); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bad split: %v", err)
	}

	l := newLoader(t, c, Train, good)
	n := good.B * good.T
	for _, tt := range []struct {
		name     string
		step     int
		in, tgts int
	}{
		{"negative step", -1, n, n},
		{"short inputs", 0, n - 1, n},
		{"long targets", 0, n, n + 1},
	} {
		if err := l.Batch(tt.step, make([]int32, tt.in), make([]int32, tt.tgts)); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Batch %s: %v, want ErrInvalidConfig", tt.name, err)
		}
	}
}

func TestBatchDoesNotAllocate(t *testing.T) {
	c := smallCorpus(t, 20, 500)
	l := newLoader(t, c, Train, LoaderConfig{Seed: 1, Workers: 2, B: 4, T: 16})
	in, tg := make([]int32, 64), make([]int32, 64)
	for step := range 50 { // warm the file cache; it holds all 20 files
		l.Batch(step, in, tg)
	}
	step := 0
	allocs := testing.AllocsPerRun(100, func() {
		if err := l.Batch(step, in, tg); err != nil {
			t.Fatal(err)
		}
		step++
	})
	if allocs != 0 {
		t.Fatalf("Batch allocates %.1f times per call", allocs)
	}
}
