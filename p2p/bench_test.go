package p2p_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/quic-go/quic-go"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
	"github.com/skein-ml/skein/p2p/wan"
)

const benchBytes = 256 << 20 // per operation on loopback

// discardAt is an io.WriterAt that drops the data (bulk benchmarks measure the network).
type discardAt struct{}

func (discardAt) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }

// zeroReader serves size zero bytes for any key.
func zeroSource(size int64) p2p.BulkSource {
	r := bytes.NewReader(make([]byte, size))
	return func(context.Context, peer.ID, string) (io.ReaderAt, int64, error) { return r, size, nil }
}

func reportGbps(b *testing.B, bytes int64, d time.Duration) float64 {
	g := float64(bytes) * 8 / d.Seconds() / 1e9
	b.ReportMetric(g, "Gbit/s")
	return g
}

// loopbackResults lets the last sub-benchmark report ratios of the same run.
var loopbackResults = map[string]float64{}

// BenchmarkLoopback compares bulk throughput on loopback: raw TCP, a raw
// quic-go stream, a libp2p QUIC stream, and the bulk API with 1 and 4 streams.
func BenchmarkLoopback(b *testing.B) {
	b.Run("tcp", func(b *testing.B) { loopbackResults["tcp"] = benchTCP(b) })
	b.Run("quic-go", func(b *testing.B) { loopbackResults["quic-go"] = benchQUIC(b) })
	s := p2ptest.NewSwarm(b, 2, p2ptest.Options{Listen: []string{"/ip4/127.0.0.1/udp/0/quic-v1"}})
	server, client := s.Nodes[0], s.Nodes[1]
	server.ServeBulk(zeroSource(benchBytes), 0)
	pid := p2p.ProtocolID("test", "sink", 1)
	server.Host().SetStreamHandler(pid, func(st network.Stream) { io.Copy(io.Discard, st); st.Close() })
	b.Run("libp2p-stream", func(b *testing.B) {
		buf := make([]byte, 1<<20)
		start := time.Now()
		for range b.N {
			st, err := client.Host().NewStream(context.Background(), server.ID(), pid)
			if err != nil {
				b.Fatal(err)
			}
			for n := 0; n < benchBytes; n += len(buf) {
				if _, err := st.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			st.CloseWrite()
			st.Read(buf[:1])
			st.Close()
		}
		loopbackResults["libp2p-stream"] = reportGbps(b, int64(b.N)*benchBytes, time.Since(start))
	})
	for _, c := range []struct {
		name           string
		streams, conns int
	}{{"bulk-1stream", 1, 1}, {"bulk-4streams", 4, 1}, {"bulk-2conns", 2, 2}, {"bulk-4conns", 4, 4}} {
		name := c.name
		b.Run(name, func(b *testing.B) {
			start := time.Now()
			for range b.N {
				if _, err := client.Fetch(context.Background(), server.ID(), "x", discardAt{}, p2p.FetchOptions{Length: benchBytes, Streams: c.streams, Conns: c.conns}); err != nil {
					b.Fatal(err)
				}
			}
			loopbackResults[name] = reportGbps(b, int64(b.N)*benchBytes, time.Since(start))
		})
	}
	b.Run("ratios", func(b *testing.B) {
		r := loopbackResults
		if r["quic-go"] > 0 {
			b.ReportMetric(r["libp2p-stream"]/r["quic-go"], "libp2p/quic-go")
		}
		if r["bulk-1stream"] > 0 {
			b.ReportMetric(r["bulk-4streams"]/r["bulk-1stream"], "4streams/1stream")
			b.ReportMetric(max(r["bulk-2conns"], r["bulk-4conns"])/r["bulk-1stream"], "bestconns/1stream")
		}
	})
}

func benchTCP(b *testing.B) float64 {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	buf := make([]byte, 1<<20)
	start := time.Now()
	for range b.N {
		c, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		for n := 0; n < benchBytes; n += len(buf) {
			if _, err := c.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		c.(*net.TCPConn).CloseWrite()
		c.Read(buf[:1])
		c.Close()
	}
	return reportGbps(b, int64(b.N)*benchBytes, time.Since(start))
}

// quicConfig matches go-libp2p's QUIC windows, for a fair comparison.
var quicConfig = &quic.Config{MaxStreamReceiveWindow: 10 << 20, MaxConnectionReceiveWindow: 15 << 20}

func selfSigned(b *testing.B) tls.Certificate {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		b.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
}

func benchQUIC(b *testing.B) float64 {
	ln, err := quic.ListenAddr("127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{selfSigned(b)}, NextProtos: []string{"bench"}}, quicConfig)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			go func() {
				for {
					st, err := c.AcceptStream(context.Background())
					if err != nil {
						return
					}
					go func() { io.Copy(io.Discard, st); st.Close() }()
				}
			}()
		}
	}()
	c, err := quic.DialAddr(context.Background(), ln.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"bench"}}, quicConfig)
	if err != nil {
		b.Fatal(err)
	}
	defer c.CloseWithError(0, "")
	buf := make([]byte, 1<<20)
	start := time.Now()
	for range b.N {
		st, err := c.OpenStreamSync(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		for n := 0; n < benchBytes; n += len(buf) {
			if _, err := st.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		st.Close()
		st.Read(buf[:1])
	}
	return reportGbps(b, int64(b.N)*benchBytes, time.Since(start))
}

// BenchmarkWAN fetches through the WAN emulator (100 Mbit/s, 40 ms one way,
// 0.1% loss, both directions) over libp2p QUIC and reports goodput as a
// fraction of the link rate, for one stream and striped.
func BenchmarkWAN(b *testing.B) {
	const rate = 100e6
	const size = 128 << 20
	e, err := wan.New(wan.Link{Latency: 40 * time.Millisecond, Rate: rate, Loss: 0.001}, 1)
	if err != nil {
		b.Fatal(err)
	}
	e.SetKeyFunc(wan.ByRemoteIP) // all connections between the two hosts share the 100 Mbit/s bottleneck
	s := p2ptest.NewSwarm(b, 2, p2ptest.Options{Listen: []string{"/ip4/127.0.0.1/udp/0/quic-v1"}, ListenUDP: e.ListenUDP, Timing: p2p.LANTiming()})
	server, client := s.Nodes[0], s.Nodes[1]
	server.ServeBulk(zeroSource(size), 0)
	for _, c := range []struct {
		name           string
		streams, conns int
		size           int64 // one stream moves ~10 Mbit/s: keep its run short
	}{{"1stream", 1, 1, 16 << 20}, {"4streams", 4, 1, 16 << 20}, {"8conns", 8, 8, size}, {"16conns", 16, 16, size}, {"24conns", 24, 24, size}} {
		b.Run(c.name, func(b *testing.B) {
			start := time.Now()
			for range b.N {
				if _, err := client.Fetch(context.Background(), server.ID(), "x", discardAt{}, p2p.FetchOptions{Length: c.size, Streams: c.streams, Conns: c.conns, ChunkSize: 1 << 20}); err != nil {
					b.Fatal(err)
				}
			}
			g := float64(b.N) * float64(c.size) * 8 / time.Since(start).Seconds()
			b.ReportMetric(g/1e6, "Mbit/s")
			b.ReportMetric(g/rate, "goodput")
			st := e.Stats()
			b.Logf("%s: link %+v; emulator lateness %+v; %d connections", c.name, st, wan.ReadLateness(), len(server.Host().Network().ConnsToPeer(client.ID())))
		})
	}
}

// BenchmarkWANRawQUIC is the reference for BenchmarkWAN: raw quic-go
// connections (no libp2p) through the same emulated link, 128 MiB split
// evenly over 1 or 16 connections.
func BenchmarkWANRawQUIC(b *testing.B) {
	for _, n := range []int{16} {
		b.Run(fmt.Sprintf("%dconns", n), func(b *testing.B) {
			for range b.N {
				e, err := wan.New(wan.Link{Latency: 40 * time.Millisecond, Rate: 100e6, Loss: 0.001}, 1)
				if err != nil {
					b.Fatal(err)
				}
				e.SetKeyFunc(wan.ByRemoteIP)
				g := rawQUICWAN(b, e, n, 128<<20)
				b.ReportMetric(g/1e6, "Mbit/s")
				b.ReportMetric(g/100e6, "goodput")
			}
		})
	}
}

func rawQUICWAN(b *testing.B, e *wan.Emulator, n, total int) float64 {
	spc, err := e.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer spc.Close()
	ln, err := quic.Listen(spc, &tls.Config{Certificates: []tls.Certificate{selfSigned(b)}, NextProtos: []string{"bench"}}, quicConfig)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	size := total / n
	go func() {
		for {
			c, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			go func() {
				st, err := c.AcceptStream(context.Background())
				if err != nil {
					return
				}
				st.Read(make([]byte, 1))
				st.Write(make([]byte, size))
				st.Close()
			}()
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cpc, err := e.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				b.Error(err)
				return
			}
			defer cpc.Close()
			tr := &quic.Transport{Conn: cpc}
			defer tr.Close()
			c, err := tr.Dial(context.Background(), spc.LocalAddr(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"bench"}}, quicConfig)
			if err != nil {
				b.Error(err)
				return
			}
			defer c.CloseWithError(0, "")
			st, _ := c.OpenStreamSync(context.Background())
			st.Write([]byte{1})
			io.Copy(io.Discard, st)
		}()
	}
	wg.Wait()
	return float64(total*8) / time.Since(start).Seconds()
}

// BenchmarkJoin16 measures process-local start to full membership of 16 nodes.
func BenchmarkJoin16(b *testing.B) {
	var total time.Duration
	for range b.N {
		start := time.Now()
		s := p2ptest.NewSwarm(b, 16, p2ptest.Options{})
		total += time.Since(start)
		s.Close()
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/join")
}
