package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// Stream is a framed libp2p stream of one protocol.
type Stream struct {
	*FrameStream
	s network.Stream
}

// Peer is the remote peer.
func (s *Stream) Peer() peer.ID { return s.s.Conn().RemotePeer() }

// Protocol is the stream's protocol ID.
func (s *Stream) Protocol() protocol.ID { return s.s.Protocol() }

// CloseWrite half-closes: the remote reads EOF after the last frame.
func (s *Stream) CloseWrite() error { return s.s.CloseWrite() }

// Close closes the stream gracefully.
func (s *Stream) Close() error { return s.s.Close() }

// Reset aborts the stream in both directions; use it on any error.
func (s *Stream) Reset() error { return s.s.Reset() }

// Raw is the underlying libp2p stream (for raw bulk bytes after a header).
func (s *Stream) Raw() network.Stream { return s.s }

// Handler serves one inbound stream. Returning an error resets the stream;
// returning nil closes it. ctx ends when the node closes.
type Handler func(ctx context.Context, s *Stream) error

// Handle serves protocol proto (/skein/<run>/<name>/<version>) with framed streams
// bounded by cfg. Like go-libp2p's ping: the stream is attached to a service
// scope, every frame has a deadline, and any error resets the stream, so a
// malformed, oversized or slow peer costs one stream and nothing else.
func (n *Node) Handle(proto Protocol, cfg FrameConfig, h Handler) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	pid := proto.ID(n.cfg.RunID)
	svc := "skein." + proto.Name
	n.setHandler(pid, func(s network.Stream) {
		if err := s.Scope().SetService(svc); err != nil {
			n.log.Debug("stream refused by resource manager", "protocol", pid, "err", err)
			s.Reset()
			return
		}
		if err := h(n.ctx, &Stream{FrameStream: NewFrameStream(s, cfg), s: s}); err != nil {
			n.log.Debug("stream reset", "protocol", pid, "peer", s.Conn().RemotePeer(), "err", err)
			s.Reset()
			return
		}
		s.Close()
	})
	return nil
}

// Unhandle removes a protocol handler.
func (n *Node) Unhandle(proto Protocol) {
	n.removeHandler(proto.ID(n.cfg.RunID))
}

// Open opens a framed stream of protocol proto to p. Relayed
// (limited) connections are used only if ctx allows them
// (network.WithAllowLimitedConn).
func (n *Node) Open(ctx context.Context, p peer.ID, proto Protocol, cfg FrameConfig) (*Stream, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if n.ctx.Err() != nil {
		return nil, ErrClosed
	}
	raw, err := n.h.NewStream(ctx, p, proto.ID(n.cfg.RunID))
	if err != nil {
		return nil, fmt.Errorf("p2p: open %s to %s: %w", proto, p, err)
	}
	s := n.limit(raw)
	return &Stream{FrameStream: NewFrameStream(s, cfg), s: s}, nil
}

// Ask is one request and its answer on proto: it sends req to p as one
// frame, half-closes, and reads the answer's frames (at most max, each a
// copy) until p closes the stream.
func (n *Node) Ask(ctx context.Context, p peer.ID, proto Protocol, cfg FrameConfig, req []byte, max int) ([][]byte, error) {
	s, err := n.Open(ctx, p, proto, cfg)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if err := s.WriteFrame(1, req); err != nil {
		s.Reset()
		return nil, err
	}
	if err := s.CloseWrite(); err != nil {
		s.Reset()
		return nil, err
	}
	var out [][]byte
	for len(out) < max {
		_, b, err := s.ReadFrame()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			s.Reset()
			return nil, err
		}
		out = append(out, bytes.Clone(b))
	}
	return out, nil
}
