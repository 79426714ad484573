package pipeline

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/skein-ml/skein/compression"
)

// TestRelayHostileSender runs a hostile node's relay (RelayConfig.Hostile,
// the staged-grad attack) among honest ones on the path 0 -> 1 -> 2, from
// each position and with each codec a staged run may use. Over four
// iterations of two microbatches each microbatch gets every combination:
// a poisoned activation or gradient, every value the largest finite bf16
// or a forged NaN. The honest node it goes to must refuse it, naming the
// hostile node, before any compute; the microbatch fails at its stage-0
// node.
//
// The largest bf16 (iterations 4 and 5) gets through without
// Relay.admit's MaxRMS bound (it is finite: the compute would get it).
// The NaN (iterations 2 and 3) fails the test without Relay.tensor
// turning the decoder's ErrNonFinite into a TensorError (the microbatch
// would fail as a malformed message, naming no one).
func TestRelayHostileSender(t *testing.T) {
	for _, codec := range []compression.Codec{compression.BF16, compression.FP32} {
		for hostile := range 3 {
			t.Run(fmt.Sprintf("%s/node %d", codec, hostile), func(t *testing.T) {
				c := compression.DefaultConfig()
				c.Codec, c.ZstdLevel, c.Workers = codec, 0, 1
				cfg := RelayConfig{Placement: Placement{Stages: 3}, Len: 8, Codec: c, Mu: 2, HopWait: 10,
					MaxStashBytes: 1 << 20, Bounds: DefaultTensorBounds()}
				s := newRelaySim(t, cfg, []int{0, 1, 2})
				hc := cfg
				hc.Self, hc.Placement, hc.Hostile = hostile, s.pl, true
				m, err := NewRelay(hc)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(m.Close)
				s.m[hostile] = m
				p := fullPath()
				s.paths = []Path{p, p}
				seen := map[string]bool{}
				for iter := uint64(2); iter <= 5; iter++ {
					s.begin(iter, []int{0, 1, 2})
					s.runUntil(1000)
					for mb := range 2 {
						kind := kindGrad
						if (iter+uint64(mb))%2 == 0 {
							kind = kindAct
						}
						seen[fmt.Sprint(mb, kind, hostileNaN(iter))] = true
						// An activation goes to the next visit (the last one's
						// back to stage 0's head), a gradient to the one before
						// (stage 0's, the head's gradient, to the last).
						to, consumer := nextNode(p, hostile), OpForward
						if to == 0 {
							consumer = OpHead
						}
						if kind == kindGrad {
							to, consumer = prevNode(p, hostile), OpBackward
						}
						o := s.out[to][iter][mb]
						var te *TensorError
						if !errors.As(o.Err, &te) || te.From != hostile || te.Kind != kind.String() {
							t.Fatalf("iteration %d, microbatch %d: node %d's outcome %+v, want a TensorError naming node %d's %s",
								iter, mb, to, o, hostile, kind)
						}
						if nan := math.IsNaN(te.Norm); nan != (iter == 2 || iter == 3) {
							t.Fatalf("iteration %d: refused a %s of norm %v: the wrong poison was sent", iter, kind, te.Norm)
						}
						if h := s.run[to].history[fakeKey{iter, mb}]; slices.Contains(h, consumer) {
							t.Fatalf("iteration %d, microbatch %d: node %d ran %v on the poisoned %s", iter, mb, to, h, kind)
						}
						if hostile != 0 {
							if o, ok := s.origin(iter, mb); !ok || o.Err == nil {
								t.Fatalf("iteration %d, microbatch %d: stage 0's outcome %+v (present %v), want a failure", iter, mb, o, ok)
							}
						}
					}
				}
				if len(seen) != 8 {
					t.Fatalf("the attack sent %d of the 8 pairs of microbatch, kind and poison: %v", len(seen), seen)
				}
			})
		}
	}
}

// TestRelayHostileSwarm: the tiny model in three stages over the
// in-memory network, stage 1 on an honest node (1) and a hostile one (2).
// The microbatches through the honest replica train as ever; those
// through the hostile one fail, their stage-0 node or next visit names
// node 2 as the offender in its log, and no honest parameter gradient
// stops being finite. Without the relay's bounds the hostile node's
// 3.39e38 activations would reach node 3's compute and its gradients
// node 0's: their gradients would overflow.
func TestRelayHostileSwarm(t *testing.T) {
	var logs lockedBuffer
	s := newSwarm(t, swarmOptions{stages: 3, stageOf: []int{0, 1, 1, 2}, codec: compression.BF16, mu: 4, hopWait: 2500,
		hostile: []int{2}, log: slog.New(slog.NewTextHandler(&logs, nil))})
	via := func(n int) Path { return Path{Nodes: []int{0, n, 3}, Stages: []int{0, 1, 2}} }
	// Microbatches 0 and 1 go through the hostile node: one is poisoned
	// on its activation, the other on its gradient, as 3.39e38 in
	// iteration 1 and NaN in iteration 2.
	paths := []Path{via(2), via(2), via(1), via(1)}
	for iter := uint64(1); iter <= 2; iter++ {
		out := s.iterate(t, iter, paths)
		for _, o := range out[0] {
			ok := paths[o.MB].Nodes[1] == 1
			if ok != (o.Err == nil) || ok && !(o.Loss > 0 && !math.IsInf(float64(o.Loss), 0)) {
				t.Fatalf("iteration %d, microbatch %d via node %d: %+v", iter, o.MB, paths[o.MB].Nodes[1], o)
			}
		}
	}
	for _, v := range []int{0, 1, 3} {
		for _, name := range s.runners[v].GradNames() {
			if i := slices.IndexFunc(s.runners[v].Grad(name), func(g float32) bool {
				return math.IsNaN(float64(g)) || math.IsInf(float64(g), 0)
			}); i >= 0 {
				t.Fatalf("node %d: %s[%d] is not finite", v, name, i)
			}
		}
	}
	// Two kinds, two iterations: each refused once, by node 3 (the
	// activations) or node 0 (the gradients).
	if n := strings.Count(logs.String(), "offender=n2"); n != 4 {
		t.Fatalf("node 2 named as the offender %d times, want 4:\n%s", n, logs.String())
	}
}

// lockedBuffer is a bytes.Buffer for loggers on several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
