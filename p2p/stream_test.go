package p2p_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
)

// TestBadFramesReset: malformed, oversized and slow frames reset their own
// stream while the node keeps serving a well-behaved peer.
func TestBadFramesReset(t *testing.T) {
	s := p2ptest.NewSwarm(t, 3, p2ptest.Options{})
	server, bad, good := s.Nodes[0], s.Nodes[1], s.Nodes[2]
	cfg := p2p.FrameConfig{Version: 1, MaxSize: 1024, ReadTimeout: 300 * time.Millisecond, WriteTimeout: time.Second}
	var served sync.Map
	if err := server.Handle(p2p.Protocol{Name: "echo", Version: 1}, cfg, func(ctx context.Context, st *p2p.Stream) error {
		for {
			typ, p, err := st.ReadFrame()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				served.Store(err.Error(), true)
				return err
			}
			if err := st.WriteFrame(typ, p); err != nil {
				return err
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	hdr := func(typ, ver uint8, flags uint16, n uint32) []byte {
		b := make([]byte, 8)
		b[0], b[1] = typ, ver
		binary.BigEndian.PutUint16(b[2:], flags)
		binary.BigEndian.PutUint32(b[4:], n)
		return b
	}
	attacks := map[string][]byte{
		"oversized": hdr(1, 1, 0, 1<<30),
		"version":   append(hdr(1, 9, 0, 1), 0),
		"flags":     append(hdr(1, 1, 1, 1), 0),
		"slow":      append(hdr(1, 1, 0, 100), 1, 2, 3), // then silence
	}
	pid := p2p.ProtocolID("test", "echo", 1)
	var wg sync.WaitGroup
	for name, payload := range attacks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := bad.Host().NewStream(context.Background(), server.ID(), pid)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			defer st.Close()
			start := time.Now()
			if _, err := st.Write(payload); err != nil {
				t.Errorf("%s: write: %v", name, err)
				return
			}
			st.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = st.Read(make([]byte, 1))
			if err == nil || errors.Is(err, io.EOF) || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: stream not reset: %v", name, err)
			}
			t.Logf("%s: reset after %v (%v)", name, time.Since(start).Round(time.Millisecond), err)
		}()
	}
	// Meanwhile a good peer is served, repeatedly.
	for i := range 20 {
		st, err := good.Open(context.Background(), server.ID(), p2p.Protocol{Name: "echo", Version: 1}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		msg := []byte{byte(i), 1, 2, 3}
		if err := st.WriteFrame(7, msg); err != nil {
			t.Fatal(err)
		}
		typ, p, err := st.ReadFrame()
		if err != nil || typ != 7 || string(p) != string(msg) {
			t.Fatalf("echo %d: typ %d %v err %v", i, typ, p, err)
		}
		st.Close()
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	n := 0
	served.Range(func(k, _ any) bool { n++; t.Logf("server saw: %v", k); return true })
	if n < len(attacks) {
		t.Errorf("server recorded %d distinct errors, want %d", n, len(attacks))
	}
	if server.NumMembers() != 3 {
		t.Errorf("server sees %d members", server.NumMembers())
	}
}
