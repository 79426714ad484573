// Package wan emulates wide-area links in user space: one-way latency,
// jitter, bandwidth (token bucket with a bounded queue) and random loss,
// configured per link. It wraps net.PacketConn (used under quic-go, through
// p2p.NodeConfig.ListenUDP) and net.Conn (TCP). Kernel netem is not needed.
//
// Effects are applied on the sending side of each endpoint, per (local,
// remote) address pair, so a link configured on both endpoints is emulated in
// both directions. On a PacketConn a lost packet is dropped; on a net.Conn
// (a reliable byte stream) a lost segment is delayed by one retransmission
// (an extra round trip plus 10 ms), which is what TCP would make of it.
package wan

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Link describes one direction of a path.
type Link struct {
	Latency time.Duration // one-way delay
	Jitter  time.Duration // extra delay, uniform in [0, Jitter); order is kept
	Rate    float64       // bits per second; 0 = unlimited
	Loss    float64       // probability in [0, 1) that a packet (segment) is lost
	// Burst is the token bucket depth in bytes; default 16 KiB (or one
	// millisecond at Rate, if larger).
	Burst int
	// Queue bounds the bottleneck buffer as a delay: a packet that would wait
	// longer than Queue for tokens is dropped (tail drop). Default: 2 x Latency
	// plus 20 ms (about one bandwidth-delay product).
	Queue time.Duration
}

// Validate names the offending value.
func (l Link) Validate() error {
	switch {
	case l.Latency < 0 || l.Jitter < 0:
		return fmt.Errorf("wan: latency %v / jitter %v must be >= 0", l.Latency, l.Jitter)
	case l.Rate < 0:
		return fmt.Errorf("wan: rate %v must be >= 0", l.Rate)
	case l.Loss < 0 || l.Loss >= 1:
		return fmt.Errorf("wan: loss %v out of range [0, 1)", l.Loss)
	case l.Burst < 0 || l.Queue < 0:
		return fmt.Errorf("wan: burst %d / queue %v must be >= 0", l.Burst, l.Queue)
	}
	return nil
}

func (l Link) burst() float64 {
	if l.Burst > 0 {
		return float64(l.Burst)
	}
	return max(16<<10, l.Rate/8/1000)
}

func (l Link) queue() time.Duration {
	if l.Queue > 0 {
		return l.Queue
	}
	return 2*l.Latency + 20*time.Millisecond
}

// KeyFunc names the link a packet from local to remote travels on. Packets
// with the same key share one token bucket and queue (one bottleneck).
type KeyFunc func(local, remote net.Addr) [2]string

// ByAddr keys links by (local "ip:port", remote "ip:port"): every socket
// pair has its own bottleneck. The default.
func ByAddr(local, remote net.Addr) [2]string { return [2]string{local.String(), remote.String()} }

// ByRemoteIP keys links by (local "ip:port", remote IP): everything one socket
// sends to one remote host shares a bottleneck, as several connections
// between two machines share their path.
func ByRemoteIP(local, remote net.Addr) [2]string {
	ip := remote.String()
	if h, _, err := net.SplitHostPort(ip); err == nil {
		ip = h
	}
	return [2]string{local.String(), ip}
}

// Emulator holds link settings and per-link state. Links are keyed by a
// KeyFunc (ByAddr unless SetKeyFunc says otherwise); unknown keys use the
// default link.
type Emulator struct {
	key   KeyFunc
	mu    sync.Mutex
	def   Link
	links map[[2]string]Link
	state map[[2]string]*shaper
	rng   *rand.Rand
}

// New returns an emulator whose links default to def.
func New(def Link, seed uint64) (*Emulator, error) {
	if err := def.Validate(); err != nil {
		return nil, err
	}
	return &Emulator{key: ByAddr, def: def, links: map[[2]string]Link{}, state: map[[2]string]*shaper{}, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}, nil
}

// SetKeyFunc changes how packets map to links; call it before any traffic.
func (e *Emulator) SetKeyFunc(f KeyFunc) {
	e.mu.Lock()
	e.key = f
	e.mu.Unlock()
}

// SetLink configures the direction from local to remote, as the KeyFunc names them.
func (e *Emulator) SetLink(local, remote string, l Link) error {
	if err := l.Validate(); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	k := [2]string{local, remote}
	e.links[k] = l
	if s := e.state[k]; s != nil {
		s.setLink(l)
	}
	return nil
}

// SetDefault changes the default link (for pairs without their own).
func (e *Emulator) SetDefault(l Link) error {
	if err := l.Validate(); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.def = l
	for k, s := range e.state {
		if _, own := e.links[k]; !own {
			s.setLink(l)
		}
	}
	return nil
}

func (e *Emulator) shaperFor(local, remote net.Addr) *shaper {
	e.mu.Lock()
	defer e.mu.Unlock()
	k := e.key(local, remote)
	s := e.state[k]
	if s == nil {
		l, ok := e.links[k]
		if !ok {
			l = e.def
		}
		s = &shaper{link: l, rng: rand.New(rand.NewPCG(e.rng.Uint64(), e.rng.Uint64())), tokens: l.burst(), last: time.Now()}
		e.state[k] = s
	}
	return s
}

// shaper is the sending side of one link: loss, token bucket, delay.
type shaper struct {
	mu     sync.Mutex
	link   Link
	rng    *rand.Rand
	tokens float64
	last   time.Time // when tokens was computed
	lastAt time.Time // latest delivery time handed out (keeps order)
	stats  Stats
}

// Stats counts what a link did to its packets (segments for a Conn).
type Stats struct {
	Packets   int64 // offered
	Bytes     int64 // offered
	Lost      int64 // random loss (on a Conn: retransmitted)
	TailDrops int64 // dropped because the queue was full
}

// Stats sums the counters of every link.
func (e *Emulator) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	var t Stats
	for _, s := range e.state {
		s.mu.Lock()
		t.Packets += s.stats.Packets
		t.Bytes += s.stats.Bytes
		t.Lost += s.stats.Lost
		t.TailDrops += s.stats.TailDrops
		s.mu.Unlock()
	}
	return t
}

func (s *shaper) setLink(l Link) {
	s.mu.Lock()
	s.link = l
	s.mu.Unlock()
}

// admit returns when a packet of n bytes sent now is delivered, or ok=false if
// it is lost (randomly or by tail drop). retransmit turns a random loss into
// one extra round trip instead (stream emulation).
func (s *shaper) admit(n int, now time.Time, retransmit bool) (at time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.link
	s.stats.Packets++
	s.stats.Bytes += int64(n)
	extra := time.Duration(0)
	if l.Loss > 0 && s.rng.Float64() < l.Loss {
		s.stats.Lost++
		if !retransmit {
			return time.Time{}, false
		}
		extra = 2*l.Latency + 10*time.Millisecond
	}
	depart := now
	if l.Rate > 0 {
		rate := l.Rate / 8 // bytes per second
		if now.After(s.last) {
			s.tokens = min(l.burst(), s.tokens+rate*now.Sub(s.last).Seconds())
			s.last = now
		}
		s.tokens -= float64(n)
		if s.tokens < 0 {
			wait := time.Duration(-s.tokens / rate * float64(time.Second))
			if !retransmit && wait > l.queue() {
				s.tokens += float64(n) // tail drop: the packet never used the link
				s.stats.TailDrops++
				return time.Time{}, false
			}
			depart = s.last.Add(wait)
		}
	}
	at = depart.Add(l.Latency + extra)
	if l.Jitter > 0 {
		at = at.Add(time.Duration(s.rng.Int64N(int64(l.Jitter))))
	}
	if at.Before(s.lastAt) {
		at = s.lastAt
	}
	s.lastAt = at
	return at, true
}

// Lateness summarises how late deliveries were against their schedule (the
// emulator's own error: goroutine wake-up latency on a busy machine).
type Lateness struct {
	N        int64
	Mean     time.Duration
	Max      time.Duration
	Over1ms  int64
	Over10ms int64
}

type latenessStats struct {
	mu               sync.Mutex
	n, over1, over10 int64
	sum, max         time.Duration
}

var lateness latenessStats

func (l *latenessStats) add(d time.Duration) {
	l.mu.Lock()
	l.n++
	l.sum += d
	l.max = max(l.max, d)
	if d > time.Millisecond {
		l.over1++
	}
	if d > 10*time.Millisecond {
		l.over10++
	}
	l.mu.Unlock()
}

// ReadLateness returns and resets the process-wide delivery lateness.
func ReadLateness() Lateness {
	lateness.mu.Lock()
	defer lateness.mu.Unlock()
	out := Lateness{N: lateness.n, Max: lateness.max, Over1ms: lateness.over1, Over10ms: lateness.over10}
	if lateness.n > 0 {
		out.Mean = lateness.sum / time.Duration(lateness.n)
	}
	lateness.n, lateness.over1, lateness.over10, lateness.sum, lateness.max = 0, 0, 0, 0, 0
	return out
}

// ErrClosed is returned by writes on a closed wrapper.
var ErrClosed = errors.New("wan: use of closed connection")

// delivery is a FIFO of timed deliveries run by one goroutine.
type delivery struct {
	mu     sync.Mutex
	cond   *sync.Cond
	q      []item
	closed bool
}

type item struct {
	at  time.Time
	buf []byte
	to  net.Addr
}

func newDelivery() *delivery {
	d := &delivery{}
	d.cond = sync.NewCond(&d.mu)
	return d
}

func (d *delivery) push(it item) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	d.q = append(d.q, it)
	d.cond.Signal()
	return true
}

// run delivers items in order at their time until closed (and, if drain,
// until the queue is empty).
func (d *delivery) run(send func(item) error, drain bool) {
	for {
		d.mu.Lock()
		for len(d.q) == 0 && !d.closed {
			d.cond.Wait()
		}
		if len(d.q) == 0 || d.closed && !drain {
			d.mu.Unlock()
			return
		}
		it := d.q[0]
		d.q = d.q[1:]
		d.mu.Unlock()
		if w := time.Until(it.at); w > 0 {
			time.Sleep(w)
		}
		if late := time.Since(it.at); late > 0 {
			lateness.add(late)
		}
		if err := send(it); err != nil && drain {
			d.close()
			return
		}
	}
}

func (d *delivery) close() {
	d.mu.Lock()
	d.closed = true
	d.cond.Broadcast()
	d.mu.Unlock()
}

func (d *delivery) queued() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, it := range d.q {
		n += len(it.buf)
	}
	return n
}
