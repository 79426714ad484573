package node

import (
	"context"
	"fmt"
	"net"
	"runtime"
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

// BenchmarkMessageWAN: one message of each size from one volunteer to
// another over libp2p (QUIC on loopback) through the packet-level WAN
// emulator at 30 ms one way and no rate limit, each after 100 ms idle (as
// a pipeline hop or a collective's part arrives: in bursts). It reports
// what a message costs beyond the one-way latency, as a fraction of the
// round trip: QUIC's pacing and congestion window, which a link model of
// latency + bytes/rate leaves out; and with every core busy computing
// (busy=true), as when several nodes share one machine. sim's
// MessageRTTFraction is the busy figure for 64-256 KB, the sizes of
// activations and of parts.
//
//	go test ./node -run '^$' -bench MessageWAN -benchtime 20x
func BenchmarkMessageWAN(b *testing.B) {
	const latency = 30 * time.Millisecond
	src, dst := wanPair(b, latency)
	ctx := context.Background()
	send := func(n int) time.Duration {
		began := time.Now()
		if err := src.Send(ctx, dst.Self(), make([]byte, n)); err != nil {
			b.Fatal(err)
		}
		if _, err := dst.Recv(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(began)
	}
	send(1 << 20) // connection, protocol and congestion window warm
	for _, busy := range []bool{false, true} {
		for _, size := range []int{16 << 10, 64 << 10, 256 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("busy=%v/size=%dKiB", busy, size>>10), func(b *testing.B) {
				if busy { // every core computing, as in a demo of several nodes on one machine
					stop := make(chan struct{})
					defer close(stop)
					for range runtime.GOMAXPROCS(0) {
						go func() {
							for x := 0; ; x++ {
								if x%1024 == 0 {
									select {
									case <-stop:
										return
									default:
									}
								}
							}
						}()
					}
				}
				var total time.Duration
				for range b.N {
					time.Sleep(100 * time.Millisecond)
					total += send(size)
				}
				per := total / time.Duration(b.N)
				b.ReportMetric(float64(per.Microseconds())/1e3, "ms/msg")
				b.ReportMetric((per-latency).Seconds()/(2*latency.Seconds()), "extra-RTT")
			})
		}
	}
}
