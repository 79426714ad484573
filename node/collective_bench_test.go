package node

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
	"github.com/skein-ml/skein/p2p/wan"
	"github.com/skein-ml/skein/replica"
)

// BenchmarkButterflyLibp2pWAN: DiLoCo rounds of the butterfly collective
// over real libp2p (QUIC on loopback) with every UDP packet through the
// packet-level WAN emulator: 30 ms one way and a 50 Mbit/s uplink per node
// (every packet a node sends shares one shaper, as a home uplink does),
// 1M parameters, int8 (the default codec). It reports seconds and
// megabytes sent per round, the figures the in-memory emulator's
// BenchmarkCollectiveWAN (optimizer) gives for the same link; with
// certs=true every member then votes for the round's state (node/certs.go)
// and the round ends when every member trusts its certificate: the
// certificate's time after the butterfly (cert-ms/round, included in
// the round's time) and its bytes (vote-kB/member/round).
//
//	go test ./node -run '^$' -bench ButterflyLibp2pWAN -benchtime 3x
func BenchmarkButterflyLibp2pWAN(b *testing.B) {
	for _, m := range []int{4, 8, 16} {
		for _, certified := range []bool{false, true} {
			b.Run(fmt.Sprintf("M=%d/certs=%v", m, certified), func(b *testing.B) {
				e, err := wan.New(wan.Link{Latency: 30 * time.Millisecond, Rate: 50e6}, 1)
				if err != nil {
					b.Fatal(err)
				}
				e.SetKeyFunc(func(local, _ net.Addr) [2]string { return [2]string{local.String(), "uplink"} })
				opts := p2ptest.Options{Listen: []string{"/ip4/127.0.0.1/udp/0/quic-v1"}, ListenUDP: e.ListenUDP, Timing: p2p.LANTiming()}
				tr := newP2PTrainers(b, m, 1<<20, opts, nil)
				var cs []*certs
				if certified {
					// Every member's chain starts at the run's start state.
					for _, n := range tr.nodes {
						c, err := newCerts(n, testLogger("certs"), &replica.Certificate{Run: n.RunID(), Hash: tr.ds[0].StateHash()}, "", nil)
						if err != nil {
							b.Fatal(err)
						}
						b.Cleanup(c.close)
						cs = append(cs, c)
					}
				}
				round := func(r int) time.Duration {
					groups := tr.roundGroups(b, r, m)
					began := time.Now()
					for i, c := range cs {
						c.vote(uint64(r), tr.ds[i].StateHash(), groups[i])
					}
					for _, c := range cs {
						for c.book.Trusted().Round < uint64(r) {
							if time.Since(began) > time.Minute {
								b.Fatalf("round %d: no certificate after a minute", r)
							}
							time.Sleep(time.Millisecond)
						}
					}
					return time.Since(began)
				}
				round(1) // connections up, estimators warm
				var sent, votes int64
				var wait time.Duration
				b.ResetTimer()
				for i := range b.N {
					before, vbefore := bytesSent(tr, p2p.ProtoReduce), bytesSent(tr, p2p.ProtoVote)
					wait += round(i + 2)
					sent += bytesSent(tr, p2p.ProtoReduce) - before
					votes += bytesSent(tr, p2p.ProtoVote) - vbefore
				}
				b.ReportMetric(float64(sent)/float64(b.N)/float64(m)/1e6, "MB/member/round")
				if certified {
					b.ReportMetric(float64(votes)/float64(b.N)/float64(m)/1e3, "vote-kB/member/round")
					b.ReportMetric(wait.Seconds()*1e3/float64(b.N), "cert-ms/round")
				}
			})
		}
	}
}

// bytesSent is what the trainers' nodes have sent on protocol proto.
func bytesSent(tr *p2pTrainers, proto p2p.Protocol) int64 {
	var n int64
	for _, nd := range tr.nodes {
		n += nd.Traffic().ByProtocol[proto.ID(nd.RunID())].Out
	}
	return n
}
