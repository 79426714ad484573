package wan

import (
	"net"
	"sync"
	"time"
)

// PacketConn emulates the links from its local address on every WriteTo.
// Reads pass through.
type PacketConn struct {
	net.PacketConn
	e    *Emulator
	mu   sync.Mutex
	outs map[string]*delivery
	once sync.Once
}

// PacketConn wraps pc.
func (e *Emulator) PacketConn(pc net.PacketConn) *PacketConn {
	return &PacketConn{PacketConn: pc, e: e, outs: map[string]*delivery{}}
}

// ListenUDP opens a UDP socket and wraps it; it fits
// p2p.NodeConfig.ListenUDP (quic-go's socket under libp2p).
func (e *Emulator) ListenUDP(network string, laddr *net.UDPAddr) (net.PacketConn, error) {
	pc, err := net.ListenUDP(network, laddr)
	if err != nil {
		return nil, err
	}
	return e.PacketConn(pc), nil
}

// WriteTo schedules p for delivery to addr after the link's delay; lost or
// tail-dropped packets are reported as written, as UDP would.
func (c *PacketConn) WriteTo(p []byte, addr net.Addr) (int, error) {
	s := c.e.shaperFor(c.LocalAddr(), addr)
	at, ok := s.admit(len(p), time.Now(), false)
	if !ok {
		return len(p), nil
	}
	buf := append([]byte(nil), p...)
	if !c.out(addr).push(item{at: at, buf: buf, to: addr}) {
		return 0, ErrClosed
	}
	return len(p), nil
}

func (c *PacketConn) out(addr net.Addr) *delivery {
	k := addr.String()
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.outs[k]
	if d == nil {
		d = newDelivery()
		c.outs[k] = d
		go d.run(func(it item) error {
			_, err := c.PacketConn.WriteTo(it.buf, it.to)
			return err
		}, false)
	}
	return d
}

// SetReadBuffer and SetWriteBuffer pass through when the socket supports them
// (quic-go asks for large buffers).
func (c *PacketConn) SetReadBuffer(n int) error {
	if b, ok := c.PacketConn.(interface{ SetReadBuffer(int) error }); ok {
		return b.SetReadBuffer(n)
	}
	return nil
}

// SetWriteBuffer passes through.
func (c *PacketConn) SetWriteBuffer(n int) error {
	if b, ok := c.PacketConn.(interface{ SetWriteBuffer(int) error }); ok {
		return b.SetWriteBuffer(n)
	}
	return nil
}

// Close drops packets still in flight and closes the socket.
func (c *PacketConn) Close() error {
	c.once.Do(func() {
		c.mu.Lock()
		for _, d := range c.outs {
			d.close()
		}
		c.mu.Unlock()
	})
	return c.PacketConn.Close()
}
