package optimizer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/skein-ml/skein/transport"
)

// BenchmarkCollectiveWAN measures one round of the butterfly, with two
// owners per part (cross-checked) and with one, on an emulated WAN: every member behind a 50 Mbit/s
// uplink with 30 ms one-way latency, averaging 1M parameters (1 MB per
// member with the 8-bit codec). Reported: seconds per round and megabytes
// sent per member and round.
//
//	go test ./optimizer -run XXX -bench CollectiveWAN -benchtime 3x
func BenchmarkCollectiveWAN(b *testing.B) {
	const n = 1 << 20
	for _, m := range []int{4, 8, 16} {
		for _, kind := range []string{"butterfly", "butterfly-1owner"} {
			b.Run(fmt.Sprintf("%s/M=%d", kind, m), func(b *testing.B) { benchCollective(b, kind, m, n) })
		}
	}
}

func benchCollective(b *testing.B, kind string, m, n int) {
	net := transport.NewMemNetwork()
	defer net.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	colls := make([]Collective, m)
	for i := range m {
		id := transport.PeerID(fmt.Sprintf("m%02d", i))
		p := net.Join(id)
		net.SetUplink(id, 50e6/8)
		net.SetDelay(id, 30*time.Millisecond, 0)
		switch kind {
		default:
			cfg := DefaultButterflyConfig(n, testSigner{id}, 0.005)
			if kind == "butterfly-1owner" {
				cfg.Replicas = 1
			}
			d, err := NewButterflyDriver(p, cfg, ButterflyOptions{Tick: 5 * time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			d.Start(ctx)
			defer d.Close()
			colls[i] = d
		}
	}
	xs := make([][]float32, m)
	outs := make([][]float32, m)
	for i := range m {
		xs[i], outs[i] = randomVec(n, uint64(i), 0.01), make([]float32, n)
	}
	sent := func() (s int64) {
		for i := range m {
			s += net.BytesSent(transport.PeerID(fmt.Sprintf("m%02d", i)))
		}
		return s
	}
	before := sent()
	b.ResetTimer()
	for r := range b.N {
		var wg sync.WaitGroup
		errs := make([]error, m)
		for i := range m {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = colls[i].AllReduceMean(ctx, uint64(r), xs[i], outs[i])
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				b.Fatalf("member %d: %v", i, err)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/round")
	b.ReportMetric(float64(sent()-before)/float64(b.N)/float64(m)/1e6, "MB/member")
	b.ReportMetric(0, "ns/op")
}
