package p2p_test

import (
	"context"
	"testing"
	"time"

	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
)

// The upload probe measures the rate that arrives: under an 8 Mbit/s cap
// on the sender's streams, about 8 Mbit/s (the doctor's upload line).
func TestMeasureUpload(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 3 MB at 1 MB/s")
	}
	s := p2ptest.NewSwarm(t, 3, p2ptest.Options{Node: func(i int, nc *p2p.NodeConfig) {
		if i == 2 {
			nc.MaxUploadBps = 1e6
		}
	}})
	recv, send := s.Nodes[1], s.Nodes[2]
	if err := recv.Handle(p2p.ProtoUploadProbe, p2p.UploadFrameConfig(), func(_ context.Context, st *p2p.Stream) error {
		return p2p.ServeUploadProbe(st)
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), p2ptest.Slowdown*30*time.Second)
	defer cancel()
	r, err := send.MeasureUpload(ctx, recv.ID(), 3<<20, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%.2f MB in %v: %.2f Mbit/s under an 8 Mbit/s cap", float64(r.Bytes)/1e6, r.Duration, r.Mbps())
	// Never above the cap (timed where the bytes arrive); below it only by
	// what a busy machine costs (5.1 Mbit/s seen with both cores loaded).
	// The accuracy on an idle machine is in BENCHMARKS.md (the doctor's
	// 0.98 of an emulated uplink).
	if r.Bytes < 1<<20 || r.Mbps() < 2 || r.Mbps() > 9 {
		t.Fatalf("measured %.2f Mbit/s (%d bytes), want at most the 8 Mbit/s cap and not a fraction of it", r.Mbps(), r.Bytes)
	}
}
