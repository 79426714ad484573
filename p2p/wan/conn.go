package wan

import (
	"net"
	"sync"
	"time"
)

// segment is the unit a stream write is cut into for emulation.
const segment = 16 << 10

// Conn emulates the link from its local to its remote address on a reliable
// byte stream. Writes are cut into 16 KiB segments, each delivered after the
// link's delay; Write blocks while more than SendBuffer bytes are queued.
type Conn struct {
	net.Conn
	s       *shaper
	d       *delivery
	sendBuf int
	mu      sync.Mutex
	space   *sync.Cond
	once    sync.Once
	done    chan struct{}
	err     error
}

// SendBuffer bounds the bytes a Conn queues before Write blocks.
const SendBuffer = 4 << 20

// Conn wraps c.
func (e *Emulator) Conn(c net.Conn) *Conn {
	w := &Conn{Conn: c, s: e.shaperFor(c.LocalAddr(), c.RemoteAddr()), d: newDelivery(), sendBuf: SendBuffer, done: make(chan struct{})}
	w.space = sync.NewCond(&w.mu)
	go func() {
		defer close(w.done)
		w.d.run(func(it item) error {
			_, err := c.Write(it.buf)
			w.mu.Lock()
			if err != nil && w.err == nil {
				w.err = err
			}
			w.space.Broadcast()
			w.mu.Unlock()
			return err
		}, true)
	}()
	return w
}

// Write queues p for delayed delivery.
func (c *Conn) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), segment)
		c.mu.Lock()
		for c.err == nil && c.d.queued() > c.sendBuf {
			c.space.Wait()
		}
		err := c.err
		c.mu.Unlock()
		if err != nil {
			return n, err
		}
		at, _ := c.s.admit(k, time.Now(), true)
		if !c.d.push(item{at: at, buf: append([]byte(nil), p[:k]...)}) {
			return n, ErrClosed
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

// Close delivers what is queued, then closes the connection.
func (c *Conn) Close() error {
	c.once.Do(func() {
		c.d.close()
		<-c.done
	})
	return c.Conn.Close()
}

// Listener wraps accepted connections.
type Listener struct {
	net.Listener
	e *Emulator
}

// Listener wraps l.
func (e *Emulator) Listener(l net.Listener) *Listener { return &Listener{Listener: l, e: e} }

// Accept wraps the next connection.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.e.Conn(c), nil
}
