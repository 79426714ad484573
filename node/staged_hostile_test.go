package node

import (
	"bytes"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/skein-ml/skein/pipeline"
)

// TestStagedCheckFreeLies runs what a HostileCheckFreeNorm volunteer
// serves (stagedVolunteer.serve: its weights claiming a norm of 1e300,
// then every weight NaN) through an honest rebuild (combineServed, then
// pipeline.Rebuild as startingWeights does, or the combined weights alone
// for a CheckFree+ copy). The rebuilt stage must be finite, must not be
// the liar's weights, and the liar must be named as the offender. Each
// case says which defence it fails without.
func TestStagedCheckFreeLies(t *testing.T) {
	const clip, norm = 1.0, 0.5             // the run's gradient clip; the honest replicas' last norm
	own := []float32{5, 5, 5, 5}            // the liar's own weights of the neighbouring stage
	prev := []float32{0.1, -0.2, 0.3, -0.4} // the honest survivors' of the same stage
	next := []float32{1, 1, 1, 1}           // the other neighbour's (an honest survivor's)
	honest := pipeline.EncodeStageWeights(norm, prev)
	// lie is the liar's k-th answer.
	lie := func(t *testing.T, k int) []byte {
		liar := &stagedVolunteer{v: &Volunteer{cfg: VolunteerConfig{Hostile: HostileCheckFreeNorm}, log: slog.New(slog.DiscardHandler)},
			weights: pipeline.EncodeStageWeights(norm, own)}
		var b []byte
		for range k {
			r, size, ok, err := liar.serve(stageWeightsKey)
			if !ok || err != nil {
				t.Fatalf("serve: %v %v", ok, err)
			}
			if b, err = io.ReadAll(io.NewSectionReader(r, 0, size)); err != nil {
				t.Fatal(err)
			}
		}
		return b
	}
	even := func(w float64) []float32 { // prev's share w against next's 1-w
		out := make([]float32, len(prev))
		for i := range out {
			out[i] = float32(w*float64(prev[i]) + (1-w)*float64(next[i]))
		}
		return out
	}
	rebuilt := func(p []float32, pn, nn float64) []float32 {
		out := make([]float32, len(p))
		if err := pipeline.Rebuild(out, p, next, pn, nn); err != nil {
			t.Fatal(err)
		}
		return out
	}
	tests := []struct {
		name string
		lie  int       // which answer of the liar's (1: the claimed norm, 2: NaN weights)
		with int       // honest survivors of its stage beside it
		copy bool      // CheckFree+: the stage is a copy of the liar's, not a Rebuild
		want []float32 // nil: no rebuild
	}{
		// The liar alone in its stage: its weights are the stage's, and
		// its 1e300 would make the rebuild a copy of them. Without
		// Combine's cap at the clip it takes Rebuild's MaxNormRatio share
		// (4/5) instead of the capped claim's 2/3.
		{name: "claimed norm, lone survivor", lie: 1, want: rebuilt(own, clip, norm)},
		// Two honest survivors out-vote it: the rebuild is as if it were
		// not there. Without the medians of Combine (means) its weights
		// and its capped claim would move it.
		{name: "claimed norm among two honest survivors", lie: 1, with: 2, want: even(0.5)},
		// Without DecodeStageWeights' refusal of non-finite weights,
		// Combine would refuse the lot and the stage would not be rebuilt.
		{name: "NaN weights beside an honest survivor, copied", lie: 2, with: 1, copy: true, want: prev},
		{name: "NaN weights beside an honest survivor, rebuilt", lie: 2, with: 1, want: even(0.5)},
		// Nothing to rebuild from but NaN: no rebuild (the newcomer retries
		// the plan) rather than a NaN stage. Needs either refusal,
		// DecodeStageWeights' or Combine's.
		{name: "NaN weights, lone survivor", lie: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			served := []servedWeights{{peer: "liar", b: lie(t, tt.lie)}}
			for range tt.with {
				served = append(served, servedWeights{peer: "honest", b: honest})
			}
			w, wn, err := combineServed(log, 1, served, len(prev), clip)
			if err == nil && !tt.copy {
				nw, nn, nerr := combineServed(log, 3, []servedWeights{{peer: "other", b: pipeline.EncodeStageWeights(norm, next)}}, len(next), clip)
				if nerr != nil {
					t.Fatal(nerr)
				}
				out := make([]float32, len(w))
				err = pipeline.Rebuild(out, w, nw, wn, nn)
				w = out
			}
			if !strings.Contains(logs.String(), "offender=liar") || strings.Contains(logs.String(), "offender=honest") {
				t.Fatalf("the liar is not (or not alone) named as the offender:\n%s", logs.String())
			}
			if tt.want == nil {
				if err == nil {
					t.Fatalf("rebuilt %v from the liar's NaN weights alone", w)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if slices.ContainsFunc(w, func(x float32) bool { return math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) }) || slices.Equal(w, own) {
				t.Fatalf("rebuilt %v: not finite, or the liar's own weights", w)
			}
			for i := range w {
				if math.Abs(float64(w[i]-tt.want[i])) > 1e-6 {
					t.Fatalf("rebuilt %v, want %v", w, tt.want)
				}
			}
		})
	}
}
