package p2p_test

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

// Send returns once the message is written, not a round trip later: a
// message to a peer must not wait for the receiver's confirmation of the
// previous one (closing a lazily negotiated stream reads it), or every
// collective and relay exchange would run at one message per RTT. With
// 200 ms one way (memberlist's LAN timing still holds), five sends to one
// peer return within one round trip, where waiting would take five, and
// all five arrive.
func TestSendDoesNotWaitForTheReceiver(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	const latency = 200 * time.Millisecond
	a, b := wanPair(t, latency)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Connection up and the protocol known to the sender's peerstore.
	if err := a.Send(ctx, b.Self(), []byte("warm")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	for i := range 5 {
		if err := a.Send(ctx, b.Self(), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(began); d >= 2*latency {
		t.Fatalf("five sends took %v: each waited for the receiver (%v one way)", d, latency)
	}
	got := map[byte]bool{}
	for range 5 {
		m, err := b.Recv(ctx)
		if err != nil {
			t.Fatalf("%d of 5 messages arrived: %v", len(got), err)
		}
		got[m.Payload[0]] = true
	}
	if len(got) != 5 {
		t.Fatalf("messages %v", got)
	}
}

// wanPair is two volunteers (and a seed) on loopback QUIC with every UDP
// packet through the WAN emulator at latency one way (one shaper per
// sending socket), and their endpoints of the activations protocol.
func wanPair(tb testing.TB, latency time.Duration) (a, b *p2p.Peers) {
	tb.Helper()
	e, err := wan.New(wan.Link{Latency: latency}, 1)
	if err != nil {
		tb.Fatal(err)
	}
	e.SetKeyFunc(func(local, _ net.Addr) [2]string { return [2]string{local.String(), "uplink"} })
	sw := p2ptest.NewSwarm(tb, 3, p2ptest.Options{Listen: []string{"/ip4/127.0.0.1/udp/0/quic-v1"}, ListenUDP: e.ListenUDP, Timing: p2p.LANTiming()})
	for i, p := range []**p2p.Peers{&a, &b} {
		if *p, err = p2p.NewPeers(sw.Nodes[1+i], p2p.ProtoActivations, 1<<22, time.Minute); err != nil {
			tb.Fatal(err)
		}
	}
	return a, b
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
//	go test ./p2p -run '^$' -bench MessageWAN -benchtime 20x
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
