package p2p

import (
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// maxPacket bounds a memberlist packet carried on a libp2p stream.
const maxPacket = 64 << 10

// maxPacketSends bounds packet sends in flight; more are dropped (memberlist
// treats packets as unreliable and retries by itself).
const maxPacketSends = 256

// maxAddrIndex bounds the transport's address index. Legitimately it holds
// one address per member plus recently dead ones (memberlist still gossips to
// them for GossipToTheDeadTime): 4x the members a node is sized for
// (DefaultLimits' ConnHigh of 256). It is fed by remote peers (a ping names
// any node and address to acknowledge), so it must be bounded; about 100
// bytes an entry.
const maxAddrIndex = 1024

// transport is a memberlist.NodeAwareTransport on libp2p streams: one short
// stream per packet (protocol members-packet), one stream per memberlist
// stream (members-stream). Node names are peer IDs; addresses are only hints
// added to the peerstore.
type gossipTransport struct {
	h   host.Host
	log *slog.Logger
	// limit puts an opened stream under the node's bandwidth caps.
	limit    func(network.Stream) network.Stream
	packetID protocol.ID
	streamID protocol.ID
	advIP    net.IP
	advPort  int
	sendTO   time.Duration
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	ctx      context.Context
	cancel   context.CancelFunc
	// abort, when set, resets every open stream once it is done: the
	// node's context, which ends before the transport's, so that a
	// push/pull in flight (memberlist.Join takes no context) does not
	// hold the node's shutdown.
	abort      context.Context
	inflight   atomic.Int64
	connected  atomic.Int64 // in-flight sends to peers already connected
	wg         sync.WaitGroup
	shutdownMu sync.Once
	// closeMu orders WriteToAddress's wg.Add against Shutdown's wg.Wait:
	// memberlist may still send while it shuts the transport down.
	closeMu sync.Mutex
	closed  bool

	mu     sync.Mutex
	byAddr *addrIndex // memberlist "ip:port" -> peer, for WriteTo without a name

	// introduce, if set, runs before a packet or stream to a peer: the node
	// presents itself at the peer's admission door (admit.go).
	introduce func(context.Context, peer.ID) error

	// accused records the suspect and dead messages of inbound packets
	// with their senders, to name them when a member declared failed
	// answers (accusation.go, dispute.go).
	accused *accusations
}

var _ memberlist.NodeAwareTransport = (*gossipTransport)(nil)

func newTransport(h host.Host, register func(protocol.ID, network.StreamHandler), runID string, advIP net.IP, advPort int, sendTO time.Duration, log *slog.Logger) *gossipTransport {
	ctx, cancel := context.WithCancel(context.Background())
	t := &gossipTransport{
		h: h, log: log, limit: func(s network.Stream) network.Stream { return s },
		packetID: ProtoMembersPacket.ID(runID),
		streamID: ProtoMembersStream.ID(runID),
		advIP:    advIP, advPort: advPort, sendTO: sendTO,
		packetCh: make(chan *memberlist.Packet, 1024),
		streamCh: make(chan net.Conn, 64),
		ctx:      ctx, cancel: cancel,
		byAddr:  newAddrIndex(maxAddrIndex),
		accused: newAccusations(),
	}
	register(t.packetID, t.handlePacket)
	register(t.streamID, t.handleStream)
	return t
}

func (t *gossipTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return t.advIP, t.advPort, nil
}

func (t *gossipTransport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }
func (t *gossipTransport) StreamCh() <-chan net.Conn           { return t.streamCh }

// WriteTo is used by memberlist only for addresses without a node name; with
// RequireNodeNames that is rare, so route through the address map.
func (t *gossipTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *gossipTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// resolve returns the peer for a memberlist address and records its address hint.
func (t *gossipTransport) resolve(a memberlist.Address) (peer.ID, error) {
	if a.Name == "" {
		t.mu.Lock()
		id, ok := t.byAddr.get(a.Addr)
		t.mu.Unlock()
		if !ok {
			return "", fmt.Errorf("p2p: memberlist address %q has no node name", a.Addr)
		}
		return id, nil
	}
	id, err := peer.Decode(a.Name)
	if err != nil {
		return "", fmt.Errorf("p2p: memberlist node name %q: %w", a.Name, err)
	}
	t.learn(id, a.Addr)
	return id, nil
}

// learn records that memberlist address addr ("ip:port", the peer's QUIC
// address) belongs to id and adds it to the peerstore as a hint
// (RecentlyConnectedAddrTTL, added again only when the mapping changes): a
// packet may name any node. Members' addresses are pinned for as long as
// they are members by the node (peerKeeper, peerstore.go).
func (t *gossipTransport) learn(id peer.ID, addr string) {
	if id == t.h.ID() || addr == "" {
		return
	}
	t.mu.Lock()
	changed := t.byAddr.put(addr, id)
	t.mu.Unlock()
	if !changed {
		return
	}
	if m, err := quicAddr(addr); err == nil {
		t.h.Peerstore().AddAddr(id, m, peerstore.RecentlyConnectedAddrTTL)
	}
}

// forget drops the addresses recorded for ids (they left or failed, or the
// node removed them from the peerstore). memberlist may still send to a dead
// member for a while (gossip to the dead), which records its address again
// until the index's LRU bound pushes it out.
func (t *gossipTransport) forget(ids ...peer.ID) {
	t.mu.Lock()
	t.byAddr.forget(ids...)
	t.mu.Unlock()
}

// addrIndex maps memberlist addresses to peers with at most max entries, the
// least recently used evicted first. Not safe for concurrent use.
type addrIndex struct {
	max int
	m   map[string]*list.Element // values are *addrEntry
	lru list.List                // front: most recently used
}

type addrEntry struct {
	addr string
	id   peer.ID
}

func newAddrIndex(max int) *addrIndex {
	return &addrIndex{max: max, m: make(map[string]*list.Element)}
}

func (x *addrIndex) size() int { return len(x.m) }

// get returns the peer at addr and marks the entry used.
func (x *addrIndex) get(addr string) (peer.ID, bool) {
	el, ok := x.m[addr]
	if !ok {
		return "", false
	}
	x.lru.MoveToFront(el)
	return el.Value.(*addrEntry).id, true
}

// put records that addr belongs to id, evicting the least recently used
// entry when full. It reports whether the mapping is new or changed.
func (x *addrIndex) put(addr string, id peer.ID) bool {
	if el, ok := x.m[addr]; ok {
		x.lru.MoveToFront(el)
		e := el.Value.(*addrEntry)
		if e.id == id {
			return false
		}
		e.id = id
		return true
	}
	if len(x.m) >= x.max {
		if back := x.lru.Back(); back != nil {
			delete(x.m, x.lru.Remove(back).(*addrEntry).addr)
		}
	}
	x.m[addr] = x.lru.PushFront(&addrEntry{addr: addr, id: id})
	return true
}

// forget removes every address of ids, in one pass over the index.
func (x *addrIndex) forget(ids ...peer.ID) {
	if len(ids) == 0 || len(x.m) == 0 {
		return
	}
	drop := make(map[peer.ID]struct{}, len(ids))
	for _, id := range ids {
		drop[id] = struct{}{}
	}
	for el := x.lru.Front(); el != nil; {
		next := el.Next()
		e := el.Value.(*addrEntry)
		if _, ok := drop[e.id]; ok {
			x.lru.Remove(el)
			delete(x.m, e.addr)
		}
		el = next
	}
}

// quicAddr turns "ip:port" into /ip4|ip6/ip/udp/port/quic-v1.
func quicAddr(addr string) (ma.Multiaddr, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return nil, fmt.Errorf("p2p: %q is not an IP", host)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return nil, err
	}
	fam := "ip4"
	if ip.To4() == nil {
		fam = "ip6"
	}
	return ma.NewMultiaddr(fmt.Sprintf("/%s/%s/udp/%s/quic-v1", fam, ip, port))
}

// WriteToAddress queues the packet and returns at once: memberlist calls it
// inline from its probe and gossip loops, and opening a stream to a dead peer
// can take the whole dial timeout.
func (t *gossipTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	id, err := t.resolve(a)
	if err != nil {
		return now, err
	}
	if len(b) > maxPacket {
		return now, fmt.Errorf("%w: memberlist packet of %d bytes, limit %d", ErrFrameTooLarge, len(b), maxPacket)
	}
	if t.ctx.Err() != nil {
		return now, ErrClosed
	}
	if t.inflight.Add(1) > maxPacketSends {
		t.inflight.Add(-1)
		return now, nil // dropped, like a full UDP socket buffer
	}
	buf := make([]byte, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	copy(buf[4:], b)
	live := t.h.Network().Connectedness(id) == network.Connected
	if live {
		t.connected.Add(1)
	}
	t.closeMu.Lock()
	if t.closed {
		t.closeMu.Unlock()
		t.inflight.Add(-1)
		if live {
			t.connected.Add(-1)
		}
		return now, ErrClosed
	}
	t.wg.Add(1)
	t.closeMu.Unlock()
	go func() {
		defer t.wg.Done()
		defer t.inflight.Add(-1)
		if live {
			defer t.connected.Add(-1)
		}
		if err := t.sendPacket(id, buf); err != nil && t.ctx.Err() == nil {
			t.log.Debug("memberlist packet not sent", "peer", id, "err", err)
		}
	}()
	return now, nil
}

func (t *gossipTransport) sendPacket(id peer.ID, buf []byte) error {
	ctx, cancel := context.WithTimeout(t.ctx, t.sendTO)
	defer cancel()
	ctx = network.WithAllowLimitedConn(ctx, "members")
	if t.introduce != nil {
		if err := t.introduce(ctx, id); err != nil {
			return err
		}
	}
	raw, err := t.h.NewStream(ctx, id, t.packetID)
	if err != nil {
		return err
	}
	s := t.limit(raw)
	_ = s.SetDeadline(time.Now().Add(t.sendTO))
	// The deadline alone would hold Shutdown for up to sendTO on a peer
	// that stopped answering (it left, or was killed): Shutdown cancels
	// t.ctx, which resets the stream at once.
	stop := context.AfterFunc(ctx, func() { raw.Reset() })
	defer stop()
	if _, err := s.Write(buf); err != nil {
		s.Reset()
		return err
	}
	if err := s.CloseWrite(); err != nil {
		s.Reset()
		return err
	}
	// Wait for the receiver's close: it has the whole packet, so closing the
	// host right after (a graceful leave) cannot cut it off.
	var b [1]byte
	if _, err := s.Read(b[:]); err != io.EOF {
		s.Reset()
		return fmt.Errorf("p2p: memberlist packet not acknowledged: %v", err)
	}
	return s.Close()
}

func (t *gossipTransport) handlePacket(s network.Stream) {
	defer s.Close()
	_ = s.SetReadDeadline(time.Now().Add(t.sendTO))
	var hdr [4]byte
	if _, err := io.ReadFull(s, hdr[:]); err != nil {
		s.Reset()
		return
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > maxPacket {
		t.log.Debug("memberlist packet size out of range", "peer", s.Conn().RemotePeer(), "size", n)
		s.Reset()
		return
	}
	buf := make([]byte, n+1)
	if _, err := io.ReadFull(s, buf[:n]); err != nil {
		s.Reset()
		return
	}
	// Read the sender's FIN, so its Close completes cleanly.
	if k, err := s.Read(buf[n:]); k != 0 || err != io.EOF {
		s.Reset()
		return
	}
	buf = buf[:n]
	now := time.Now()
	// Read-only, before memberlist acts on the packet: a dispute it causes
	// finds the record.
	t.accused.record(now, s.Conn().RemotePeer(), parseAccusations(buf))
	p := &memberlist.Packet{Buf: buf, From: t.remoteAddr(s), Timestamp: now}
	select {
	case t.packetCh <- p:
	case <-t.ctx.Done():
	}
}

// remoteAddr returns the remote's transport address as a net.Addr, or a
// placeholder for relayed connections.
func (t *gossipTransport) remoteAddr(s network.Stream) net.Addr {
	m := s.Conn().RemoteMultiaddr()
	if ip, err := manet.ToIP(m); err == nil {
		if p, err := m.ValueForProtocol(ma.P_UDP); err == nil {
			port, _ := strconv.Atoi(p)
			return &net.UDPAddr{IP: ip, Port: port}
		}
		if p, err := m.ValueForProtocol(ma.P_TCP); err == nil {
			port, _ := strconv.Atoi(p)
			return &net.TCPAddr{IP: ip, Port: port}
		}
	}
	return peerAddr(s.Conn().RemotePeer())
}

func (t *gossipTransport) handleStream(s network.Stream) {
	c := t.newStreamConn(s)
	select {
	case t.streamCh <- c:
	case <-t.ctx.Done():
		s.Reset()
	}
}

func (t *gossipTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	id, err := t.resolve(a)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(t.ctx, timeout)
	defer cancel()
	ctx = network.WithAllowLimitedConn(ctx, "members")
	if t.introduce != nil {
		if err := t.introduce(ctx, id); err != nil {
			return nil, err
		}
	}
	raw, err := t.h.NewStream(ctx, id, t.streamID)
	if err != nil {
		return nil, err
	}
	s := t.limit(raw)
	return t.newStreamConn(s), nil
}

// newStreamConn wraps s for memberlist, reset when t.abort ends.
func (t *gossipTransport) newStreamConn(s network.Stream) *streamConn {
	c := &streamConn{Stream: s, local: &net.UDPAddr{IP: t.advIP, Port: t.advPort}, remote: t.remoteAddr(s)}
	if t.abort != nil {
		c.resetWhenDone(t.abort)
	}
	return c
}

// drain waits up to timeout for packets queued to connected peers to go out
// (a graceful leave's dead message is still queued when memberlist.Leave
// returns); sends still dialing unreachable peers are abandoned.
func (t *gossipTransport) drain(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for t.connected.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

func (t *gossipTransport) Shutdown() error {
	t.shutdownMu.Do(func() {
		t.closeMu.Lock()
		t.closed = true
		t.closeMu.Unlock()
		t.h.RemoveStreamHandler(t.packetID)
		t.h.RemoveStreamHandler(t.streamID)
		t.cancel()
		t.wg.Wait()
	})
	return nil
}

// streamConn presents a libp2p stream as the net.Conn memberlist expects.
//
// Its deadlines also reset the stream shortly after they pass: a Read on
// a fresh outbound stream waits in the lazy multistream handshake, which
// a stream deadline does not end (seen: a push/pull to a member that was
// leaving held the volunteer's shutdown for good, and the demo killed
// it). memberlist sets a deadline on every stream it uses, so no read or
// write outlives it by more than deadlineGrace.
type streamConn struct {
	network.Stream
	local, remote net.Addr

	mu      sync.Mutex
	timer   *time.Timer // resets the stream at the deadline plus grace
	closed  bool
	unabort func() bool // stops the reset at the transport's abort
}

// deadlineGrace is how long after a deadline streamConn resets its
// stream: the stream's own deadline, where it works, fails the call first.
const deadlineGrace = 250 * time.Millisecond

func (c *streamConn) LocalAddr() net.Addr  { return c.local }
func (c *streamConn) RemoteAddr() net.Addr { return c.remote }

func (c *streamConn) SetDeadline(t time.Time) error {
	c.arm(t)
	return c.Stream.SetDeadline(t)
}

func (c *streamConn) SetReadDeadline(t time.Time) error {
	c.arm(t)
	return c.Stream.SetReadDeadline(t)
}

func (c *streamConn) SetWriteDeadline(t time.Time) error {
	c.arm(t)
	return c.Stream.SetWriteDeadline(t)
}

// resetWhenDone resets the stream when ctx ends before Close.
func (c *streamConn) resetWhenDone(ctx context.Context) {
	c.unabort = context.AfterFunc(ctx, func() { c.Stream.Reset() })
}

// arm resets the stream at t plus deadlineGrace (the zero t: never),
// replacing the last deadline's reset.
func (c *streamConn) arm(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if t.IsZero() || c.closed {
		return
	}
	c.timer = time.AfterFunc(time.Until(t)+deadlineGrace, func() { c.Stream.Reset() })
}

// Close closes both directions; memberlist is done with the stream.
func (c *streamConn) Close() error {
	c.mu.Lock()
	c.closed = true
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
	if c.unabort != nil {
		c.unabort()
	}
	err := c.Stream.Close()
	if errors.Is(err, network.ErrReset) {
		return nil
	}
	return err
}

// peerAddr is the net.Addr of a peer reached without an IP (relayed).
type peerAddr peer.ID

func (p peerAddr) Network() string { return "libp2p" }
func (p peerAddr) String() string  { return "0.0.0.0:0" }
