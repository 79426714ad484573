package pipeline

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/skein-ml/skein/compression"
)

// TestRelayBounds: a hop of a two-stage path (node 1, stage 1) takes its
// activation from node 0 and, later, the gradient of the head on node 0.
// After warm honest microbatches (all values 1), one tensor comes with the
// values given: one that is not finite or is past the bounds fails the
// microbatch, names node 0 and tells it why, and reaches no compute; one
// past Clip times the edge's median reaches it clipped; the rest reach it
// unchanged.
func TestRelayBounds(t *testing.T) {
	bf16Max := float32(3.3895314e38) // the largest finite bf16
	tests := []struct {
		name   string
		kind   relayKind
		warm   int
		value  float32 // every element of the tensor
		refuse bool
		want   float32 // every element the compute gets
	}{
		{name: "largest bf16 gradient", kind: kindGrad, value: bf16Max, refuse: true},
		{name: "largest bf16 activation", kind: kindAct, value: bf16Max, refuse: true},
		{name: "NaN gradient", kind: kindGrad, warm: normWarm, value: float32(math.NaN()), refuse: true},
		{name: "Inf activation", kind: kindAct, value: float32(math.Inf(-1)), refuse: true},
		{name: "past the cap before warm-up", kind: kindGrad, value: 2e4, refuse: true},
		{name: "large before warm-up", kind: kindGrad, value: 100, want: 100},
		{name: "honest after warm-up", kind: kindGrad, warm: normWarm, value: -3, want: -3},
		{name: "clipped past 4x the median", kind: kindGrad, warm: normWarm, value: 10, want: 4},
		{name: "clipped activation", kind: kindAct, warm: normWarm, value: -10, want: -4},
		{name: "refused past 64x the median", kind: kindGrad, warm: normWarm, value: 100, refuse: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newBoundsHop(t)
			for i := range tt.warm {
				h.iteration(uint64(i+1), kindGrad, 1)
			}
			rd := h.iteration(uint64(tt.warm+1), tt.kind, tt.value)
			if !tt.refuse {
				if len(rd.Outcomes) != 0 || len(h.got) != 1 {
					t.Fatalf("outcomes %+v, compute got %d tensors", rd.Outcomes, len(h.got))
				}
				for i, x := range h.got[0] {
					if math.Abs(float64(x-tt.want)) > 1e-5*math.Abs(float64(tt.want)) {
						t.Fatalf("compute got [%d] = %v, want %v", i, x, tt.want)
					}
				}
				return
			}
			var te *TensorError
			if len(rd.Outcomes) != 1 || !errors.As(rd.Outcomes[0].Err, &te) || te.From != 0 || te.Kind != tt.kind.String() {
				t.Fatalf("outcomes %+v, want one TensorError from node 0", rd.Outcomes)
			}
			if len(h.got) != 0 {
				t.Fatalf("the refused %s reached the compute", tt.kind)
			}
			told := false
			for _, e := range rd.Messages {
				m, err := parseRelayMsg(e.Payload)
				told = told || (err == nil && e.To == 0 && m.kind == kindFail && m.reason == reasonTensor)
			}
			if !told {
				t.Fatalf("node 0 was not told: %+v", rd.Messages)
			}
		})
	}
}

// boundsHop is node 1 of the placement {0: stage 0, 1: stage 1}, driven by
// hand; got collects the tensors its compute was given, after warm-up.
type boundsHop struct {
	t   *testing.T
	r   *Relay
	enc *compression.Encoder
	p   Path
	got [][]float32
}

func newBoundsHop(t *testing.T) *boundsHop {
	c := compression.DefaultConfig()
	c.Codec, c.ZstdLevel, c.Workers = compression.FP32, 0, 1
	cfg := RelayConfig{Self: 1, Placement: Placement{Stages: 2, StageOf: []int{0, 1}}, Len: 8, Codec: c, Mu: 1,
		HopWait: 10, MaxStashBytes: 1 << 20, Bounds: DefaultTensorBounds()}
	r, err := NewRelay(cfg)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := compression.NewEncoder(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); enc.Close() })
	return &boundsHop{t: t, r: r, enc: enc, p: Path{Nodes: []int{0, 1}, Stages: []int{0, 1}}}
}

// iteration runs iteration iter's one microbatch at the hop up to the
// tensor of kind k, which has every value v (the activation before it is
// all ones), and returns what that tensor produced; got holds what the
// compute was given for it.
func (h *boundsHop) iteration(iter uint64, k relayKind, v float32) Ready {
	h.t.Helper()
	h.got = nil
	if _, err := h.r.Begin(iter, []Path{h.p}); err != nil {
		h.t.Fatal(err)
	}
	h.r.Ready() // the last iteration's visit, aborted

	send := func(k relayKind, v float32) Ready {
		// The encoder refuses values that are not finite: a hostile
		// sender forges them in the one chunk's fp32 body, after its
		// 32-byte frame header and 20-byte chunk header, and checksums it.
		finite := !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0)
		x := make([]float32, 8)
		for i := range x {
			x[i] = v
			if !finite {
				x[i] = 0
			}
		}
		frame, err := h.enc.Append(nil, x, 0)
		if err != nil {
			h.t.Fatal(err)
		}
		if !finite {
			for i := range x {
				binary.LittleEndian.PutUint32(frame[52+4*i:], math.Float32bits(v))
			}
			binary.LittleEndian.PutUint64(frame[32:], xxhash.Sum64(frame[40:]))
		}
		h.r.Step(0, appendRelayMsg(nil, relayMsg{kind: k, iter: iter, mb: 0, stage: 1, hop: 1, path: h.p, frame: frame}))
		rd := h.r.Ready()
		for _, w := range rd.Work {
			if w.Op == OpForward || w.Op == OpBackward {
				h.got = append(h.got, w.In)
			}
		}
		return rd
	}
	if k == kindAct {
		return send(kindAct, v)
	}
	send(kindAct, 1)
	h.r.Done(Result{Op: OpForward, Iter: iter, MB: 0, Out: make([]float32, 8)})
	h.r.Ready()
	h.got = nil
	return send(kindGrad, v)
}
