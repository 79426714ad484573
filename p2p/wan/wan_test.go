package wan

import (
	"io"
	"net"
	"testing"
	"time"
)

func udpPair(t *testing.T, e *Emulator) (*PacketConn, net.PacketConn) {
	t.Helper()
	a, err := e.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	b, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	b.SetReadBuffer(8 << 20)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a.(*PacketConn), b
}

func TestPacketLatencyRateLoss(t *testing.T) {
	e, _ := New(Link{}, 1)
	a, b := udpPair(t, e)
	const lat = 30 * time.Millisecond
	const rate = 20e6
	if err := e.SetLink(a.LocalAddr().String(), b.LocalAddr().String(), Link{Latency: lat, Rate: rate, Loss: 0.1, Queue: time.Second}); err != nil {
		t.Fatal(err)
	}
	const n, size = 2000, 1000
	start := time.Now()
	for i := range n {
		p := make([]byte, size)
		p[0] = byte(i)
		a.WriteTo(p, b.LocalAddr())
	}
	got := 0
	var first, last time.Time
	buf := make([]byte, 2000)
	b.SetReadDeadline(time.Now().Add(3 * time.Second))
	for {
		if _, _, err := b.ReadFrom(buf); err != nil {
			break
		}
		if got == 0 {
			first = time.Now()
		}
		last = time.Now()
		got++
		b.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	}
	lossFrac := 1 - float64(got)/n
	delay := first.Sub(start)
	span := last.Sub(start).Seconds()
	wantSpan := float64(got*size*8)/rate + lat.Seconds()
	t.Logf("received %d/%d (loss %.3f), first after %v, all after %.3fs (want ~%.3fs)", got, n, lossFrac, delay, span, wantSpan)
	if lossFrac < 0.06 || lossFrac > 0.14 {
		t.Errorf("loss %.3f, want ~0.10", lossFrac)
	}
	if delay < lat || delay > lat+100*time.Millisecond { // generous: shared CPUs, -race
		t.Errorf("first packet after %v, want ~%v", delay, lat)
	}
	if span < 0.9*wantSpan || span > 1.15*wantSpan {
		t.Errorf("transfer took %.3fs, want ~%.3fs", span, wantSpan)
	}
}

func TestTailDrop(t *testing.T) {
	e, _ := New(Link{Rate: 1e6, Queue: 50 * time.Millisecond}, 1)
	a, b := udpPair(t, e)
	for range 100 { // 100 KB at 1 Mbit/s: only ~50 ms (6 KB + burst) fit in the queue
		a.WriteTo(make([]byte, 1000), b.LocalAddr())
	}
	got := 0
	buf := make([]byte, 2000)
	b.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	for {
		if _, _, err := b.ReadFrom(buf); err != nil {
			break
		}
		got++
	}
	if got < 15 || got > 30 {
		t.Errorf("received %d packets, want ~22 (burst 16 KiB + 50 ms at 1 Mbit/s)", got)
	}
}

func TestConnLatencyRate(t *testing.T) {
	e, _ := New(Link{Latency: 20 * time.Millisecond, Rate: 50e6, Loss: 0.01}, 2)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const size = 2 << 20
	done := make(chan time.Duration)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		start := time.Now()
		n, _ := io.Copy(io.Discard, c)
		if n != size {
			t.Errorf("received %d bytes, want %d", n, size)
		}
		done <- time.Since(start)
	}()
	raw, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := e.Conn(raw)
	if _, err := c.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	took := <-done
	want := time.Duration(float64(size*8) / 50e6 * float64(time.Second))
	t.Logf("2 MiB at 50 Mbit/s + 20 ms in %v (line rate alone %v)", took, want)
	// Never faster than the line: the emulator's promise. How close to it
	// a busy machine comes is the benchmarks' business; here only a shaper
	// that stalls (several times the line time) fails.
	if took < want || took > 4*want+time.Second {
		t.Errorf("took %v, want at least %v (the line rate) and not several times it", took, want)
	}
}
