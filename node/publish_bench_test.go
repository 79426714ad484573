package node

import (
	"testing"

	"github.com/skein-ml/skein/optimizer"
)

// BenchmarkPublish124M is what a DiLoCo volunteer does with the shared
// state of a 124M-parameter model from one round's result to the next
// round's start: serve it (the blob joiners download, with its chunk
// hashes), then hash it for the next round's collective. Run with
// GOMAXPROCS=1 and -cpu 1 for one core's figure.
func BenchmarkPublish124M(b *testing.B) {
	const n = 124_000_000
	phi := make([]float32, n)
	for i := range phi {
		phi[i] = float32(i%1000) * 1e-3
	}
	d, err := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, phi)
	if err != nil {
		b.Fatal(err)
	}
	v := &Volunteer{dl: d}
	for b.Loop() {
		d.Touch() // a new round's state
		v.serveDiLoCo()
		_ = d.StateHash()
	}
}
