package node

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
	"github.com/skein-ml/skein/p2p/wan"
)

// BenchmarkButterflyLibp2pWAN: DiLoCo rounds of the butterfly collective
// over real libp2p (QUIC on loopback) with every UDP packet through the
// packet-level WAN emulator: 30 ms one way and a 50 Mbit/s uplink per node
// (every packet a node sends shares one shaper, as a home uplink does),
// 1M parameters, int8 (the default codec). It reports seconds and
// megabytes sent per round, the figures the in-memory emulator's
// BenchmarkCollectiveWAN (optimizer) gives for the same link.
//
//	go test ./node -run '^$' -bench ButterflyLibp2pWAN -benchtime 3x
func BenchmarkButterflyLibp2pWAN(b *testing.B) {
	for _, m := range []int{4, 8} {
		b.Run(fmt.Sprintf("M=%d", m), func(b *testing.B) {
			e, err := wan.New(wan.Link{Latency: 30 * time.Millisecond, Rate: 50e6}, 1)
			if err != nil {
				b.Fatal(err)
			}
			e.SetKeyFunc(func(local, _ net.Addr) [2]string { return [2]string{local.String(), "uplink"} })
			opts := p2ptest.Options{Listen: []string{"/ip4/127.0.0.1/udp/0/quic-v1"}, ListenUDP: e.ListenUDP, Timing: p2p.LANTiming()}
			tr := newP2PTrainers(b, m, 1<<20, opts, nil)
			tr.round(b, 0, m) // connections up, estimators warm
			var sent int64
			b.ResetTimer()
			for i := range b.N {
				before := bytesSent(tr)
				tr.round(b, i+1, m)
				sent += bytesSent(tr) - before
			}
			b.ReportMetric(float64(sent)/float64(b.N)/float64(m)/1e6, "MB/member/round")
		})
	}
}

// bytesSent is what the trainers' nodes have sent on the reduce protocol.
func bytesSent(tr *p2pTrainers) int64 {
	var n int64
	for _, nd := range tr.nodes {
		n += nd.Traffic().ByProtocol[p2p.ProtoReduce.ID(nd.RunID())].Out
	}
	return n
}
