package p2p

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/transport"
)

// Peers implements transport.Peers on a Node: each message travels on
// its own short framed stream of its protocol (ProtoReduce for the collective) (one stream
// per message worked better than a reused stream, P2P-NOTES.md), and the
// group is the run's members whose role is volunteer (the bootstrap seed
// and relays do not train).
type Peers struct {
	n     *Node
	proto Protocol
	cfg   FrameConfig
	inbox chan transport.Message

	// Byte budgets of the inbox: what one peer may have queued, and all
	// together. A peer flooding messages fills its own share and loses
	// the excess; the others' messages still get in.
	perPeer, total int64
	mu             sync.Mutex
	queued         map[transport.PeerID]int64
	queuedAll      int64
}

// inboxMessages bounds the inbox in messages; its byte budgets are
// perPeerMessages of the largest message per peer, totalMessages in all.
const (
	inboxMessages   = 1024
	perPeerMessages = 4
	totalMessages   = 32
)

// NewPeers registers the protocol and returns the endpoint. maxMessage
// bounds one message (a chunk of the all-reduce), checked before allocation.
func NewPeers(n *Node, proto Protocol, maxMessage uint32, timeout time.Duration) (*Peers, error) {
	cfg := DefaultFrameConfig()
	cfg.MaxSize = maxMessage
	cfg.ReadTimeout, cfg.WriteTimeout = timeout, timeout
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Peers{n: n, proto: proto, cfg: cfg, inbox: make(chan transport.Message, inboxMessages),
		queued: map[transport.PeerID]int64{}}
	p.perPeer = min(perPeerMessages*int64(maxMessage), max(int64(maxMessage), 1<<30))
	p.total = min(totalMessages*int64(maxMessage), max(2*p.perPeer, 4<<30))
	err := n.Handle(proto, cfg, func(ctx context.Context, s *Stream) error {
		if m, ok := n.Member(s.Peer()); !ok || m.Meta.Role != RoleVolunteer {
			return fmt.Errorf("p2p: %s is not a volunteer of this run", s.Peer())
		}
		_, payload, err := s.ReadFrame()
		if err != nil {
			return err
		}
		from := transport.PeerID(s.Peer().String())
		if !p.reserve(from, int64(len(payload))) {
			return nil // over this peer's budget: dropped (the collective's deadlines cover it)
		}
		msg := transport.Message{From: from, Payload: append([]byte(nil), payload...)}
		select {
		case p.inbox <- msg:
		default: // nobody drains (a long inner phase): drop, never park the stream
			p.release(from, int64(len(payload)))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Close unregisters the protocol.
func (p *Peers) Close() { p.n.Unhandle(p.proto) }

// Self implements transport.Peers.
func (p *Peers) Self() transport.PeerID { return transport.PeerID(p.n.ID().String()) }

// Members implements transport.Peers.
func (p *Peers) Members() []transport.PeerID {
	var out []transport.PeerID
	for _, m := range p.n.Members() {
		if m.Meta.Role == RoleVolunteer {
			out = append(out, transport.PeerID(m.ID.String()))
		}
	}
	return out
}

// Send implements transport.Peers. A failed attempt is retried (up to 3
// times, with a short backoff) while the peer is still a member: one broken
// stream must not get a live member excluded from a round.
func (p *Peers) Send(ctx context.Context, to transport.PeerID, payload []byte) error {
	id, err := peer.Decode(string(to))
	if err != nil {
		return fmt.Errorf("%w: bad peer ID %q: %v", transport.ErrPeerGone, to, err)
	}
	for attempt := 0; ; attempt++ {
		// Bound each try: dialing a peer that has just left can otherwise
		// take far longer than a round waits for anyone.
		actx, cancel := context.WithTimeout(ctx, min(p.cfg.WriteTimeout, 10*time.Second))
		err = p.sendOnce(actx, id, payload)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if _, member := p.n.Member(id); !member || attempt == 2 {
			return fmt.Errorf("%w: %s: %v", transport.ErrPeerGone, to, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(50<<attempt) * time.Millisecond):
		}
	}
}

func (p *Peers) sendOnce(ctx context.Context, id peer.ID, payload []byte) error {
	s, err := p.n.Open(ctx, id, p.proto, p.cfg)
	if err != nil {
		return err
	}
	// A write blocked by a receiver that stopped reading (it left, was
	// killed, or is paused) ends with ctx, not only at the write deadline:
	// a volunteer stopping with Ctrl-C cancels its sends and leaves at once.
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	if err := s.WriteFrame(1, payload); err != nil {
		s.Reset()
		return err
	}
	if err := s.CloseWrite(); err != nil {
		s.Reset()
		return err
	}
	// The frame is written and the stream half-closed: delivery no longer
	// needs this side. Close waits for the receiver (go-multistream's lazy
	// protocol negotiation first reads the receiver's confirmation), a full
	// round trip that would hold every later message to this peer behind
	// it: one message per RTT (P2P-NOTES.md). So it runs on its own,
	// bounded by the read deadline; an error there (the receiver closed
	// first) does not undo delivery.
	_ = s.Raw().SetReadDeadline(time.Now().Add(p.cfg.ReadTimeout))
	go s.Close()
	return nil
}

// reserve takes n bytes of from's share of the inbox, if they fit.
func (p *Peers) reserve(from transport.PeerID, n int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.queued[from]+n > p.perPeer || p.queuedAll+n > p.total {
		return false
	}
	p.queued[from] += n
	p.queuedAll += n
	return true
}

func (p *Peers) release(from transport.PeerID, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.queued[from] -= n; p.queued[from] <= 0 {
		delete(p.queued, from)
	}
	p.queuedAll -= n
}

// Recv implements transport.Peers.
func (p *Peers) Recv(ctx context.Context) (transport.Message, error) {
	select {
	case m := <-p.inbox:
		p.release(m.From, int64(len(m.Payload)))
		return m, nil
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.Canceled) {
			return transport.Message{}, fmt.Errorf("%w: %v", transport.ErrClosed, ctx.Err())
		}
		return transport.Message{}, ctx.Err()
	}
}

// Signer is the transport.Signer of this node: messages signed with its
// libp2p identity, verified against the sender's peer ID.
func (n *Node) Signer() transport.Signer { return nodeSigner{n} }

type nodeSigner struct{ n *Node }

func (s nodeSigner) Sign(msg []byte) ([]byte, error) { return s.n.Sign(msg) }

func (s nodeSigner) Verify(id transport.PeerID, msg, sig []byte) bool {
	return VerifyPeer(string(id), msg, sig)
}
