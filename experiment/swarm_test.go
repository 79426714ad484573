package experiment

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/optimizer"
)

func smallSwarm(alg Algorithm) SwarmConfig {
	rc := compression.DefaultConfig()
	rc.Codec, rc.ZstdLevel = compression.MinMax8, 0
	a := optimizer.DefaultAdamW()
	a.LR, a.Warmup = 1e-3, 2
	nl := optimizer.DefaultNoLoCo()
	return SwarmConfig{Algorithm: alg, Preset: "tiny", Workers: 3, Batch: 2, SeqLen: 32, InnerSteps: 3, Rounds: 2,
		Seed: 1, Threads: 1, AdamW: a, DiLoCo: optimizer.DefaultDiLoCo(), NoLoCo: nl, Codec: rc, EvalBatches: 1}
}

func TestRunSwarmAlgorithms(t *testing.T) {
	for _, alg := range []Algorithm{Sync, Single, DiLoCo, NoLoCo} {
		t.Run(string(alg), func(t *testing.T) {
			res, err := RunSwarm(context.Background(), smallSwarm(alg))
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Curve) != 3 || res.Curve[2].Step != 6 {
				t.Fatalf("curve %+v", res.Curve)
			}
			if !(res.FinalValLoss < res.Curve[0].ValLoss) {
				t.Errorf("validation loss %v -> %v did not fall", res.Curve[0].ValLoss, res.FinalValLoss)
			}
			distributed := alg == DiLoCo || alg == NoLoCo
			if distributed != (res.BytesSent > 0) {
				t.Errorf("%s sent %d bytes", alg, res.BytesSent)
			}
		})
	}
}

func TestRunSwarmDeterministic(t *testing.T) {
	a, err := RunSwarm(context.Background(), smallSwarm(DiLoCo))
	if err != nil {
		t.Fatal(err)
	}
	b, err := RunSwarm(context.Background(), smallSwarm(DiLoCo))
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.Curve {
		if a.Curve[i] != b.Curve[i] {
			t.Fatalf("eval %d: %+v vs %+v", i, a.Curve[i], b.Curve[i])
		}
	}
}

// The sparse all-gather arm trains, is deterministic, and sends a small
// fraction of the minmax8 butterfly's bytes.
func TestRunSwarmSparse(t *testing.T) {
	cfg := smallSwarm(DiLoCo)
	sc := compression.SparseConfig{Chunk: 1024, K: 16, Level: 1}
	cfg.Sparse = &sc
	a, err := RunSwarm(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !(a.FinalValLoss < a.Curve[0].ValLoss) {
		t.Errorf("validation loss %v -> %v did not fall", a.Curve[0].ValLoss, a.FinalValLoss)
	}
	b, err := RunSwarm(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.Curve {
		if a.Curve[i] != b.Curve[i] {
			t.Fatalf("eval %d: %+v vs %+v", i, a.Curve[i], b.Curve[i])
		}
	}
	dense, err := RunSwarm(context.Background(), smallSwarm(DiLoCo))
	if err != nil {
		t.Fatal(err)
	}
	if a.BytesSent <= 0 || a.BytesSent*10 > dense.BytesSent {
		t.Fatalf("sparse sent %d bytes, the minmax8 butterfly %d", a.BytesSent, dense.BytesSent)
	}
}

// The sparse all-gather's robust rule works per coordinate over the union:
// a coordinate one member alone sends is trimmed (however large), one that
// every member sends comes through, and a hostile member's x1000 is
// clipped; every member gets the same bits.
func TestSparseGatherRobust(t *testing.T) {
	const m, n = 4, 1024
	sc := compression.SparseConfig{Chunk: 1024, K: 4, Level: 1}
	hub := newSparseHub(m)
	outs := make([][]float32, m)
	errs := make([]error, m)
	var wg sync.WaitGroup
	for i := range m {
		g, err := newSparseGather(hub, i, n, sc, 1)
		if err != nil {
			t.Fatal(err)
		}
		g.robust = optimizer.DefaultRobust()
		x := make([]float32, n)
		x[5], x[9] = 1, -1 // every member
		x[100+i] = 1.5     // this member alone
		if i == m-1 {
			for j := range x {
				x[j] *= 1000
			}
		}
		outs[i] = make([]float32, n)
		wg.Go(func() { _, errs[i] = g.AllReduceMean(context.Background(), 0, x, outs[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	got := outs[0]
	for i := range m {
		if !slices.Equal(outs[i], got) {
			t.Fatalf("member %d got other bits", i)
		}
		if got[100+i] != 0 {
			t.Errorf("member %d's lone coordinate came through: %v", i, got[100+i])
		}
	}
	// 2-bit values (1 and -1 decode to 1.25 and -0.5 here): the shared
	// coordinates come through with their signs and the x1000 clipped.
	if !(got[5] > 0.4 && got[5] < 2 && got[9] < -0.4 && got[9] > -2) {
		t.Errorf("shared coordinates %v, %v; want about 1, -1", got[5], got[9])
	}
}
