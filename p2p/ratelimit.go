package p2p

import (
	"context"
	"math"

	"github.com/libp2p/go-libp2p/core/network"
	"golang.org/x/time/rate"
)

// A volunteer's bandwidth caps (NodeConfig.MaxUploadBps, MaxDownloadBps)
// hold on every stream the node opens or accepts, whatever the transport
// (QUIC, TCP, a relay): each stream's writes wait for the node's upload
// token bucket, and each read, once done, for its download bucket. A
// reader held back reads less, so the sender's flow control slows the
// sender: the download cap holds without dropping anything. Memberlist's
// gossip rides on streams too and shares the caps.

// limiter is one direction's token bucket; nil means no cap.
type limiter struct{ *rate.Limiter }

// newLimiter caps at bps bytes per second (0: none), with a burst of a
// tenth of a second (at least 16 KiB, the size writes are cut into).
func newLimiter(bps float64) *limiter {
	if !(bps > 0) || math.IsInf(bps, 0) {
		return nil
	}
	burst := max(int(bps/10), limitChunk)
	return &limiter{rate.NewLimiter(rate.Limit(bps), burst)}
}

// limitChunk is the most bytes one wait is for.
const limitChunk = 16 << 10

// wait takes n bytes' worth of tokens, in chunks the bucket can hold.
func (l *limiter) wait(ctx context.Context, n int) error {
	for n > 0 {
		k := min(n, l.Burst())
		if err := l.WaitN(ctx, k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// limitedStream is a stream under the node's caps.
type limitedStream struct {
	network.Stream
	ctx      context.Context // the node's: a closing node stops waiting
	up, down *limiter
}

// limit puts s under the node's caps (s itself when there are none).
func (n *Node) limit(s network.Stream) network.Stream {
	if n.up == nil && n.down == nil {
		return s
	}
	return &limitedStream{Stream: s, ctx: n.limitCtx, up: n.up, down: n.down}
}

func (s *limitedStream) Write(p []byte) (int, error) {
	if s.up == nil {
		return s.Stream.Write(p)
	}
	written := 0
	for len(p) > 0 {
		k := min(len(p), limitChunk)
		if err := s.up.wait(s.ctx, k); err != nil {
			return written, err
		}
		w, err := s.Stream.Write(p[:k])
		written += w
		if err != nil {
			return written, err
		}
		p = p[k:]
	}
	return written, nil
}

func (s *limitedStream) Read(p []byte) (int, error) {
	if s.down == nil {
		return s.Stream.Read(p)
	}
	if len(p) > limitChunk {
		p = p[:limitChunk]
	}
	n, err := s.Stream.Read(p)
	if n > 0 {
		if werr := s.down.wait(s.ctx, n); werr != nil && err == nil {
			err = werr
		}
	}
	return n, err
}
