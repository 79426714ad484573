package p2p

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
)

// hangingStream is a stream whose Read ignores deadlines (as a read inside
// the lazy multistream handshake does) and ends only when it is reset.
type hangingStream struct {
	network.Stream // nil: only the methods below are used
	reset          chan struct{}
	resets         int
}

func (s *hangingStream) Read([]byte) (int, error) {
	<-s.reset
	return 0, network.ErrReset
}

func (s *hangingStream) Reset() error {
	s.resets++
	if s.resets == 1 {
		close(s.reset)
	}
	return nil
}

func (s *hangingStream) Close() error                     { return nil }
func (s *hangingStream) SetDeadline(time.Time) error      { return nil }
func (s *hangingStream) SetReadDeadline(time.Time) error  { return nil }
func (s *hangingStream) SetWriteDeadline(time.Time) error { return nil }

// A read that the stream's deadline does not end is ended by the reset
// streamConn arms at the deadline; a closed conn is never reset.
func TestStreamConnDeadlineResets(t *testing.T) {
	s := &hangingStream{reset: make(chan struct{})}
	c := &streamConn{Stream: s}
	began := time.Now()
	if err := c.SetDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, network.ErrReset) {
			t.Fatalf("read ended with %v, want a reset", err)
		}
		if d := time.Since(began); d < 20*time.Millisecond {
			t.Fatalf("reset after %v, before the deadline", d)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a read past its deadline still blocks")
	}

	s2 := &hangingStream{reset: make(chan struct{})}
	c2 := &streamConn{Stream: s2}
	c2.SetDeadline(time.Now().Add(10 * time.Millisecond))
	c2.SetDeadline(time.Time{}) // cleared: no reset
	c3 := &streamConn{Stream: &hangingStream{reset: make(chan struct{})}}
	c3.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	c3.Close()
	time.Sleep(10*time.Millisecond + 2*deadlineGrace)
	if s2.resets != 0 || c3.Stream.(*hangingStream).resets != 0 {
		t.Fatalf("resets after a cleared deadline %d, after close %d; want none", s2.resets, c3.Stream.(*hangingStream).resets)
	}
}

// The node's end resets a stream in flight (a push/pull that memberlist.Join
// started, which takes no context), and not one already closed.
func TestStreamConnResetWhenDone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := &hangingStream{reset: make(chan struct{})}
	c := &streamConn{Stream: s}
	c.resetWhenDone(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		done <- err
	}()
	closed := &hangingStream{reset: make(chan struct{})}
	c2 := &streamConn{Stream: closed}
	c2.resetWhenDone(ctx)
	c2.Close()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, network.ErrReset) {
			t.Fatalf("read ended with %v, want a reset", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a read still blocks after the node's end")
	}
	time.Sleep(50 * time.Millisecond)
	if closed.resets != 0 {
		t.Fatal("a closed stream was reset")
	}
}
