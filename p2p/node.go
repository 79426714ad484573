package p2p

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/host/peerstore/pstoremem"
	"github.com/libp2p/go-libp2p/p2p/protocol/identify"
	"github.com/libp2p/go-libp2p/p2p/protocol/ping"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// NodeConfig configures a node (volunteer, observer or seed).
type NodeConfig struct {
	RunID   string // required; protocol IDs and metadata carry it
	DataDir string // identity.key and peers.json; "" = ephemeral identity, nothing persisted

	// Identity overrides the key in DataDir (tests).
	Identity crypto.PrivKey

	// ListenAddrs defaults to QUIC-v1 and TCP on all IPv4 interfaces, port 0.
	ListenAddrs []string
	// AdvertiseAddr ("ip:port") is the QUIC address gossiped in membership;
	// default: the first non-loopback QUIC listen address (loopback if none).
	AdvertiseAddr string

	// Bootstrap lists full multiaddrs (with /p2p/<id>) of seeds. Known peers
	// from the peer book are tried after them.
	Bootstrap []string

	Meta   Meta // RunID, TCPPort and Token are filled in by the node
	Timing Timing

	// Admission is the run's admission policy (admission.go). nil: the
	// node learns it from the first peer that admits it when it joins (a
	// volunteer, which learns the run's settings from its members), and
	// admits no one else until then; a node that joins no one is then open.
	Admission *Admission
	// Token is this node's join token (IssueToken); a closed run admits
	// no node without one, for its peer ID, run and Meta.Role.
	Token []byte
	// RunKey, when set, is the run key's private half: the node issues its
	// own token with it (a bootstrap run by the operator) and renews it
	// before it expires. Token is then ignored.
	RunKey ed25519.PrivateKey
	Limits Limits

	Reachability Reachability
	RelayService bool // act as a relay v2 (seeds)
	HolePunching bool // DCUtR; on by default in DefaultNodeConfig

	// ListenUDP replaces the UDP socket under QUIC (WAN emulation, tests).
	ListenUDP func(network string, laddr *net.UDPAddr) (net.PacketConn, error)

	// MaxUploadBps and MaxDownloadBps cap what the node sends and receives
	// on all its streams together, in bytes per second (0: no cap;
	// ratelimit.go). The caps are gossiped in Meta (CapUpMbps,
	// CapDownMbps) so that planners count on them.
	MaxUploadBps, MaxDownloadBps float64

	JoinTimeout time.Duration // per join attempt
	// RejoinInterval is how often the node re-contacts missing seeds or known
	// peers, saves the peer book and trims state fed by remote peers.
	RejoinInterval time.Duration
	// ForgetAfter is how long a peer that is neither a member nor connected
	// keeps its libp2p peerstore entry (addresses, keys, protocols,
	// metadata): the first RejoinInterval tick after that removes it. Seeds
	// are never removed. DefaultNodeConfig sets 15 min, libp2p's
	// RecentlyConnectedAddrTTL: no address libp2p still counts as valid is
	// removed early. Keep it at least Timing.GossipToTheDeadTime: memberlist
	// still writes to a dead member that long.
	ForgetAfter time.Duration
	// JoinAlone lets NewNode succeed with no reachable peer (seeds).
	JoinAlone bool
	// PeerBookSize bounds the peer book (memory and peers.json): the most
	// recently seen peers are kept. 1..MaxPeerBookSize; DefaultNodeConfig
	// sets MaxPeerBookSize.
	PeerBookSize int

	Logger *slog.Logger

	// peerstoreClock, when set, is the peerstore's clock (tests move it past
	// address TTLs).
	peerstoreClock interface{ Now() time.Time }
}

// DefaultNodeConfig returns a volunteer configuration with WAN timing.
func DefaultNodeConfig(runID string) NodeConfig {
	return NodeConfig{
		RunID:        runID,
		ListenAddrs:  []string{"/ip4/0.0.0.0/udp/0/quic-v1", "/ip4/0.0.0.0/tcp/0"},
		Meta:         Meta{Role: RoleVolunteer, Stage: -1},
		Timing:       WANTiming(),
		Limits:       DefaultLimits(),
		HolePunching: true,
		JoinTimeout:  10 * time.Second, RejoinInterval: 30 * time.Second,
		ForgetAfter:  peerstore.RecentlyConnectedAddrTTL,
		PeerBookSize: MaxPeerBookSize,
	}
}

// Validate names the offending value.
func (c NodeConfig) Validate() error {
	if err := ValidateRunID(c.RunID); err != nil {
		return err
	}
	if len(c.ListenAddrs) == 0 {
		return errors.New("p2p: NodeConfig.ListenAddrs is empty")
	}
	for _, a := range c.ListenAddrs {
		if _, err := ma.NewMultiaddr(a); err != nil {
			return fmt.Errorf("p2p: listen address %q: %w", a, err)
		}
	}
	for _, a := range c.Bootstrap {
		if _, err := peer.AddrInfoFromString(a); err != nil {
			return fmt.Errorf("p2p: bootstrap address %q (want a multiaddr ending in /p2p/<id>): %w", a, err)
		}
	}
	if c.AdvertiseAddr != "" {
		if _, err := quicAddr(c.AdvertiseAddr); err != nil {
			return fmt.Errorf("p2p: AdvertiseAddr %q: %w", c.AdvertiseAddr, err)
		}
	}
	if err := c.Timing.Validate(); err != nil {
		return err
	}
	if err := c.Limits.Validate(); err != nil {
		return err
	}
	if c.JoinTimeout <= 0 || c.RejoinInterval <= 0 {
		return fmt.Errorf("p2p: JoinTimeout %v / RejoinInterval %v must be positive", c.JoinTimeout, c.RejoinInterval)
	}
	if c.ForgetAfter <= 0 {
		return fmt.Errorf("p2p: NodeConfig.ForgetAfter %v must be positive", c.ForgetAfter)
	}
	if c.PeerBookSize < 1 || c.PeerBookSize > MaxPeerBookSize {
		return fmt.Errorf("p2p: NodeConfig.PeerBookSize %d out of range [1, %d]", c.PeerBookSize, MaxPeerBookSize)
	}
	if c.Admission != nil {
		if err := c.Admission.Validate(); err != nil {
			return err
		}
	}
	if len(c.Token) > 0 {
		if _, err := ParseToken(c.Token); err != nil {
			return fmt.Errorf("p2p: NodeConfig.Token: %w", err)
		}
	}
	if c.RunKey != nil && len(c.RunKey) != ed25519.PrivateKeySize {
		return fmt.Errorf("p2p: NodeConfig.RunKey of %d bytes, want an ed25519 private key of %d", len(c.RunKey), ed25519.PrivateKeySize)
	}
	return nil
}

// Node is one member of a run: a libp2p host plus memberlist membership.
type Node struct {
	cfg   NodeConfig
	log   *slog.Logger
	h     host.Host
	bw    *accounting
	tr    *gossipTransport
	ml    *memberlist.Memberlist
	ev    *events
	md    *metaDelegate
	book  *peerBook
	seeds []peer.AddrInfo
	// keeper pins members' addresses in the peerstore and forgets idle
	// peers (peerstore.go).
	keeper *peerKeeper
	byeID  protocol.ID
	admID  protocol.ID // the admission handshake (admit.go)
	acl    *relayACL

	// admMu orders learning the admission policy; introMu guards intros,
	// when this node presents itself again to each peer (admit.go).
	admMu   sync.Mutex
	introMu sync.Mutex
	intros  map[peer.ID]time.Time

	metaMu sync.Mutex
	meta   Meta
	// metaInc is the incarnation of the metadata last signed (metasig.go);
	// advIP and advPort the memberlist address signed with it.
	metaInc uint64
	advIP   net.IP
	advPort uint16

	// up and down are the bandwidth caps (nil: none); limitCtx ends their
	// waits when the node closes.
	up, down    *limiter
	limitCtx    context.Context
	limitCancel context.CancelFunc
	// memberDialed, set by tests, is told when the connection attempt to a
	// new member has ended.
	memberDialed atomic.Pointer[func(peer.ID)]

	handlersMu sync.Mutex
	handlers   map[protocol.ID]network.StreamHandler
	lanes      []host.Host // extra connections for striping (lanes.go)
	key        crypto.PrivKey

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// NewNode starts a node and joins the run through its bootstrap addresses or
// known peers. It fails with ErrWrongRun when the peers reached belong to
// another run and ErrNoSeed when none is reachable (unless JoinAlone).
func NewNode(ctx context.Context, cfg NodeConfig) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	key := cfg.Identity
	if key == nil && cfg.DataDir != "" {
		k, err := LoadOrCreateIdentity(cfg.DataDir)
		if err != nil {
			return nil, err
		}
		key = k
	}
	if key == nil {
		k, _, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			return nil, err
		}
		key = k
	}
	book, err := loadPeerBook(cfg.DataDir, cfg.PeerBookSize)
	if err != nil {
		return nil, err
	}
	var seeds []peer.AddrInfo
	for _, a := range cfg.Bootstrap {
		ai, _ := peer.AddrInfoFromString(a)
		seeds = append(seeds, *ai)
	}
	n := &Node{cfg: cfg, log: log, bw: newAccounting(maxTrafficPairs), book: book, seeds: seeds, key: key,
		handlers: make(map[protocol.ID]network.StreamHandler),
		byeID:    ProtoMembersBye.ID(cfg.RunID), admID: ProtoAdmission.ID(cfg.RunID),
		intros: make(map[peer.ID]time.Time), acl: &relayACL{},
		up: newLimiter(cfg.MaxUploadBps), down: newLimiter(cfg.MaxDownloadBps)}
	n.limitCtx, n.limitCancel = context.WithCancel(context.Background())
	var relays []peer.AddrInfo
	if !cfg.RelayService {
		relays = seeds
		for _, r := range book.list() {
			if r.Role == RoleBootstrap && len(relays) < 4 && !containsPeer(relays, r.ID) {
				relays = append(relays, peer.AddrInfo{ID: r.ID, Addrs: r.Addrs})
			}
		}
	}
	var ps peerstore.Peerstore
	if cfg.peerstoreClock != nil {
		if ps, err = pstoremem.NewPeerstore(pstoremem.WithClock(cfg.peerstoreClock)); err != nil {
			return nil, fmt.Errorf("p2p: peerstore: %w", err)
		}
	}
	listen := cfg.ListenAddrs
	if cfg.DataDir != "" {
		saved, err := loadPorts(cfg.DataDir)
		if err != nil {
			log.Warn("the ports of the last run are not readable; listening on new ones", "err", err)
		}
		listen = stickyListen(listen, saved)
	}
	params := hostParams{key: key, listen: listen, limits: cfg.Limits, reachability: cfg.Reachability,
		relayService: cfg.RelayService, relays: relays, holePunching: cfg.HolePunching, listenUDP: cfg.ListenUDP, bw: n.bw,
		peerstore: ps, relayACL: n.acl}
	n.h, err = newHost(params)
	if err != nil && ps == nil && !slices.Equal(listen, cfg.ListenAddrs) {
		// The last run's port was taken between the check and the bind.
		log.Info("the ports of the last run are taken; listening on new ones", "err", err)
		params.listen = cfg.ListenAddrs
		n.h, err = newHost(params)
	}
	if err != nil {
		return nil, err
	}
	if cfg.DataDir != "" {
		if err := savePorts(cfg.DataDir, cfg.ListenAddrs, n.h.Network().ListenAddresses()); err != nil {
			log.Warn("could not save the listen ports", "err", err)
		}
	}
	n.keeper = newPeerKeeper(n.h.Peerstore(), n.h.ID())
	n.log = log.With("peer", shortID(n.h.ID()))
	if err := n.start(ctx); err != nil {
		n.h.Close()
		return nil, err
	}
	return n, nil
}

func containsPeer(l []peer.AddrInfo, id peer.ID) bool {
	for _, a := range l {
		if a.ID == id {
			return true
		}
	}
	return false
}

func shortID(id peer.ID) string {
	s := id.String()
	if len(s) > 8 {
		return s[len(s)-8:]
	}
	return s
}

func (n *Node) start(ctx context.Context) error {
	cfg := n.cfg
	advIP, advPort, tcpPort, err := n.advertise()
	if err != nil {
		return err
	}
	meta := cfg.Meta
	meta.RunID = cfg.RunID
	meta.TCPPort = uint16(tcpPort)
	if cfg.MaxUploadBps > 0 {
		meta.CapUpMbps = float32(cfg.MaxUploadBps * 8 / 1e6)
	}
	if cfg.MaxDownloadBps > 0 {
		meta.CapDownMbps = float32(cfg.MaxDownloadBps * 8 / 1e6)
	}
	meta.Token = string(cfg.Token)
	n.advIP, n.advPort = advIP, uint16(advPort)
	if cfg.RunKey != nil {
		tok, err := n.issueOwnToken(time.Now())
		if err != nil {
			return err
		}
		meta.Token = string(tok)
	}
	mb, err := n.signedMeta(meta)
	if err != nil {
		return err
	}
	n.meta = meta
	n.md = &metaDelegate{meta: mb}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.ev = newEvents(cfg.RunID, n.h.ID(), n.log)
	n.ev.hooks = n.onEvent
	n.ev.direct = n.directIP
	for _, s := range n.seeds {
		n.ev.exempt[s.ID] = true
	}
	if cfg.Admission != nil {
		if err := n.checkOwnToken(*cfg.Admission); err != nil {
			return err
		}
		n.ev.setPolicy(*cfg.Admission)
	} else {
		n.ev.learning = true
	}
	allow := func(p peer.ID) bool { return n.ev.admitted(p, time.Now()) }
	n.acl.allow.Store(&allow)
	n.setHandler(n.admID, n.handleAdmission)
	n.tr = newTransport(n.h, n.setHandler, cfg.RunID, advIP, advPort, cfg.Timing.StreamTimeout, n.log)
	n.tr.limit = n.limit
	n.tr.abort = n.ctx // a push/pull in flight ends with the node
	n.tr.introduce = n.introduce
	n.ev.reach = n.answers
	n.ev.blame = func(id peer.ID) []string { return n.tr.accused.about(id, time.Now()) }
	n.setHandler(n.byeID, n.handleBye)

	mc := memberlist.DefaultLANConfig()
	cfg.Timing.apply(mc)
	mc.Name = n.h.ID().String()
	mc.Transport = n.tr
	mc.Delegate = n.md
	mc.Events = n.ev
	mc.Alive = n.ev
	mc.Merge = n.ev
	mc.RequireNodeNames = true
	mc.BindPort, mc.AdvertisePort = 0, 0
	mc.DisableTcpPings = true
	mc.UDPBufferSize = 16 << 10
	mc.LogOutput = slogWriter{n.log}
	n.ml, err = memberlist.Create(mc)
	if err != nil {
		n.tr.Shutdown()
		return fmt.Errorf("p2p: memberlist: %w", err)
	}

	cands := n.candidates()
	if len(cands) > 0 {
		joined, err := n.join(ctx, cands)
		var refused *NotAdmittedError
		if joined == 0 && (!cfg.JoinAlone || errors.As(err, &refused)) {
			n.shutdown()
			if err == nil {
				err = ErrNoSeed
			}
			return err
		}
		if joined == 0 {
			n.log.Warn("started alone: no seed or known peer reachable", "err", err)
		}
	} else if !cfg.JoinAlone {
		n.shutdown()
		return fmt.Errorf("%w: no bootstrap address and an empty peer book", ErrNoSeed)
	}
	if _, learning := n.ev.policy(); learning {
		// Alone: nobody to learn from, so the run is this node's, open.
		n.log.Warn("no peer stated the run's admission policy; admitting anyone")
		if err := n.learn(Admission{}, n.h.ID()); err != nil {
			n.shutdown()
			return err
		}
	}
	n.wg.Add(1)
	go n.maintain()
	n.log.Debug("node started", "addrs", n.Addrs(), "members", n.ml.NumMembers())
	return nil
}

// advertise picks the memberlist address (QUIC ip:port) and the TCP port.
func (n *Node) advertise() (net.IP, int, int, error) {
	var quic, tcp []ma.Multiaddr
	for _, a := range n.h.Network().ListenAddresses() {
		if _, err := a.ValueForProtocol(ma.P_QUIC_V1); err == nil {
			quic = append(quic, a)
		} else if _, err := a.ValueForProtocol(ma.P_TCP); err == nil {
			tcp = append(tcp, a)
		}
	}
	tcpPort := 0
	for _, a := range tcp {
		if p, err := a.ValueForProtocol(ma.P_TCP); err == nil {
			tcpPort, _ = strconv.Atoi(p)
			break
		}
	}
	if n.cfg.AdvertiseAddr != "" {
		h, p, _ := net.SplitHostPort(n.cfg.AdvertiseAddr)
		port, _ := strconv.Atoi(p)
		return net.ParseIP(h), port, tcpPort, nil
	}
	if len(quic) == 0 {
		return nil, 0, 0, errors.New("p2p: no QUIC listen address; membership needs one")
	}
	var best net.IP
	port := 0
	for _, a := range quic {
		ip, err := manet.ToIP(a)
		if err != nil {
			continue
		}
		p, _ := a.ValueForProtocol(ma.P_UDP)
		pp, _ := strconv.Atoi(p)
		if ip.IsUnspecified() {
			// Resolve the wildcard against interface addresses.
			for _, ha := range n.h.Addrs() {
				if hp, _ := ha.ValueForProtocol(ma.P_UDP); hp != p {
					continue
				}
				if hip, err := manet.ToIP(ha); err == nil && (best == nil || best.IsLoopback() && !hip.IsLoopback()) {
					best, port = hip, pp
				}
			}
			continue
		}
		if best == nil || best.IsLoopback() && !ip.IsLoopback() {
			best, port = ip, pp
		}
	}
	if best == nil {
		return nil, 0, 0, errors.New("p2p: no usable QUIC address to advertise")
	}
	return best, port, tcpPort, nil
}

// candidates are the seeds, then known peers, most recent first.
func (n *Node) candidates() []peer.AddrInfo {
	out := append([]peer.AddrInfo(nil), n.seeds...)
	for _, r := range n.book.list() {
		if r.ID != n.h.ID() && !containsPeer(out, r.ID) && len(r.Addrs) > 0 {
			out = append(out, peer.AddrInfo{ID: r.ID, Addrs: r.Addrs})
		}
	}
	return out
}

// Join contacts the given peers (full multiaddrs) and merges their view of
// the run. It returns how many were joined.
func (n *Node) Join(ctx context.Context, addrs []string) (int, error) {
	var cands []peer.AddrInfo
	for _, a := range addrs {
		ai, err := peer.AddrInfoFromString(a)
		if err != nil {
			return 0, fmt.Errorf("p2p: join address %q: %w", a, err)
		}
		cands = append(cands, *ai)
	}
	return n.join(ctx, cands)
}

// joinGrace is how long join waits for more candidates once one answered.
const joinGrace = 500 * time.Millisecond

// join connects to candidates concurrently, checks they serve this run, then
// runs memberlist's push/pull join with those reached.
func (n *Node) join(ctx context.Context, cands []peer.AddrInfo) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.JoinTimeout)
	defer cancel()
	type res struct {
		ai  peer.AddrInfo
		err error
	}
	ch := make(chan res, len(cands))
	for _, ai := range cands {
		go func() {
			if ai.ID == n.h.ID() {
				ch <- res{ai, errors.New("self")}
				return
			}
			err := n.h.Connect(network.WithAllowLimitedConn(ctx, "join"), ai)
			if err == nil {
				n.awaitIdentify(ctx, ai.ID)
				err = n.checkRun(ai.ID)
				// A peer that has just started may register its run's
				// protocols after identify ran: its identify push follows.
				for wait := time.Now().Add(2 * time.Second); errors.Is(err, ErrNoSeed) && time.Now().Before(wait) && ctx.Err() == nil; {
					time.Sleep(50 * time.Millisecond)
					err = n.checkRun(ai.ID)
				}
			}
			if err == nil {
				// The door: this node's token (or address) against the
				// peer's policy, which a node still learning takes.
				var adm Admission
				if adm, err = n.ask(ctx, ai.ID); err == nil {
					err = n.learn(adm, ai.ID)
				}
			}
			ch <- res{ai, err}
		}()
	}
	// Once one candidate answered, the others get joinGrace more: one member
	// is enough to learn the whole membership, and a stale peer-book entry
	// (a member that has left) would otherwise hold the join for the whole
	// dial timeout.
	var joins []string
	var errs []error
	var grace <-chan time.Time
collect:
	for range cands {
		var r res
		select {
		case r = <-ch:
		case <-grace:
			errs = append(errs, fmt.Errorf("%d candidates still dialing after the first answered", len(cands)-len(joins)-len(errs)))
			break collect
		}
		if r.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.ai.ID, r.err))
			continue
		}
		joins = append(joins, n.joinString(r.ai.ID))
		if grace == nil {
			grace = time.After(joinGrace)
		}
	}
	if len(joins) > 0 {
		n.awaitHolePunching(ctx)
	}
	err := errors.Join(errs...)
	if len(joins) == 0 {
		// A refusal says more than a dial error: the node cannot join.
		for _, e := range errs {
			var refused *NotAdmittedError
			if errors.As(e, &refused) {
				return 0, refused
			}
		}
		if err != nil && !errors.Is(err, ErrWrongRun) {
			err = fmt.Errorf("%w: %w", ErrNoSeed, err)
		}
		return 0, err
	}
	k, jerr := n.ml.Join(joins)
	if k == 0 {
		return 0, fmt.Errorf("%w: memberlist join: %w", ErrNoSeed, errors.Join(jerr, err))
	}
	return k, nil
}

// holePunchProto is DCUtR's protocol; a host serves it once hole punching is
// ready (it knows a public observed address).
const holePunchProto = "/libp2p/dcutr"

// awaitHolePunching waits (at most 8 s) until a node behind NAT can hole
// punch: a relayed connection made before that is never upgraded to a direct
// one, and joining makes connections to every member. libp2p's hole-punching
// service looks for a public observed address with a backoff (checks at
// 0.25, 0.75, 1.75, 3.75, 7.75 s): an address observed at 2 s on a loaded
// machine is seen at 3.75 s, past the 3 s this waited before, and that
// node never punched (the NAT test failed once under -race in CI).
func (n *Node) awaitHolePunching(ctx context.Context) {
	if !n.cfg.HolePunching || n.cfg.Reachability != ReachabilityPrivate || len(n.seeds) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	for {
		for _, p := range n.h.Mux().Protocols() {
			if p == holePunchProto {
				return
			}
		}
		select {
		case <-ctx.Done():
			n.log.Warn("hole punching not ready; joining anyway")
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// awaitIdentify waits until identify has run on every connection to id.
// Connect waits for it only when it dials: with a connection already open
// (another candidate's goroutine dialed the same peer a moment ago, or the
// peer dialed us) it returns at once, and the peer's protocols, which
// checkRun reads, may not be known yet.
func (n *Node) awaitIdentify(ctx context.Context, id peer.ID) {
	h, ok := n.h.(interface{ IDService() identify.IDService })
	if !ok {
		return
	}
	for _, c := range n.h.Network().ConnsToPeer(id) {
		select {
		case <-h.IDService().IdentifyWait(c):
		case <-ctx.Done():
			return
		}
	}
}

// checkRun refuses a peer that speaks membership for another run only.
func (n *Node) checkRun(id peer.ID) error {
	protos, err := n.h.Peerstore().GetProtocols(id)
	if err != nil {
		return err
	}
	other := ""
	for _, p := range protos {
		if p == n.tr.streamID {
			return nil
		}
		if r := runOfProtocol(p); r != "" && strings.HasSuffix(string(p), "/"+ProtoMembersStream.String()) {
			other = r
		}
	}
	if other != "" {
		return fmt.Errorf("%w: peer %s serves run %q, this node %q", ErrWrongRun, id, other, n.cfg.RunID)
	}
	return fmt.Errorf("%w: peer %s does not serve membership for run %q", ErrNoSeed, id, n.cfg.RunID)
}

// joinString is memberlist's "name/ip:port" for a connected peer.
func (n *Node) joinString(id peer.ID) string {
	hp := "0.0.0.0:1"
	addrs := n.h.Peerstore().Addrs(id)
	for _, c := range n.h.Network().ConnsToPeer(id) {
		addrs = append([]ma.Multiaddr{c.RemoteMultiaddr()}, addrs...)
	}
	for _, a := range addrs {
		if _, err := a.ValueForProtocol(ma.P_QUIC_V1); err != nil {
			continue
		}
		if na, err := manet.ToNetAddr(a); err == nil {
			hp = na.String()
			break
		}
	}
	return id.String() + "/" + hp
}

// onEvent runs under the event lock: keep libp2p's view in step.
func (n *Node) onEvent(kind EventKind, m Member) {
	switch kind {
	case EventJoin, EventUpdate:
		n.tr.learn(m.ID, m.Addr)
		// Its QUIC, TCP and relayed addresses stay in the peerstore while it
		// is a member (peerstore.go).
		n.keeper.pin(m.ID, n.memberAddrs(m))
		n.h.ConnManager().Protect(m.ID, "members")
		if kind == EventJoin && m.ID != n.h.ID() && n.h.Network().Connectedness(m.ID) != network.Connected {
			// Connect now, so the first probe does not pay for the dial.
			go func() { // ends with the node's context or the host
				ctx, cancel := context.WithTimeout(n.ctx, n.cfg.JoinTimeout)
				defer cancel()
				_ = n.h.Connect(network.WithAllowLimitedConn(ctx, "members"), peer.AddrInfo{ID: m.ID})
				if err := n.introduce(ctx, m.ID); err != nil {
					n.log.Debug("not admitted by a new member", "member", m.ID, "err", err)
				}
				if f := n.memberDialed.Load(); f != nil {
					(*f)(m.ID)
				}
			}()
		}
		var addrs []ma.Multiaddr
		for _, a := range n.h.Peerstore().Addrs(m.ID) {
			if _, err := a.ValueForProtocol(ma.P_CIRCUIT); err != nil && len(addrs) < maxPeerAddrs {
				addrs = append(addrs, a)
			}
		}
		// The book's bootstraps become relays at the next start: only a
		// bootstrap this node dialled is recorded as one, never a member
		// that claims the role.
		role := m.Meta.Role
		if role == RoleBootstrap && !n.IsSeed(m.ID) {
			role = RoleObserver
		}
		n.book.put(PeerRecord{ID: m.ID, Addrs: addrs, Role: role, LastSeen: time.Now()})
	case EventLeave, EventFail:
		n.h.ConnManager().Unprotect(m.ID, "members")
		n.tr.forget(m.ID)
		n.keeper.unpin(m.ID)
	}
}

// answers checks directly that member id is alive, for a dispute
// (dispute.go): it answers a libp2p ping before ctx ends. Without a
// connection the ping dials one: a live member this node happens not to be
// connected to (it joined a moment ago, or is reached only on demand) must
// not be dropped on a forged word, and a dead one fails within ctx all the
// same (a closed port at once, a silent one at the deadline).
func (n *Node) answers(ctx context.Context, id peer.ID) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the pinger after its first result
	r, ok := <-ping.Ping(ctx, n.h, id)
	switch {
	case !ok: // ctx ended before an answer; the pinger closed the channel
		return fmt.Errorf("p2p: ping %s: %w", id, context.Cause(ctx))
	case r.Error != nil:
		return fmt.Errorf("p2p: ping %s: %w", id, r.Error)
	}
	return nil
}

func (n *Node) handleBye(s network.Stream) {
	n.ev.markLeft(s.Conn().RemotePeer(), time.Now())
	s.Close()
}

// maintain re-contacts missing seeds or known peers, saves the peer book and
// trims the tables fed by remote peers (goodbyes, traffic counters, the
// peerstore).
func (n *Node) maintain() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.RejoinInterval)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		var missing []peer.AddrInfo
		for _, s := range n.seeds {
			if _, ok := n.ev.get(s.ID); !ok && s.ID != n.h.ID() {
				missing = append(missing, s)
			}
		}
		if n.ev.count() <= 1 {
			missing = n.candidates()
		}
		if len(missing) > 0 {
			if k, err := n.join(n.ctx, missing); err != nil && n.ctx.Err() == nil {
				n.log.Debug("rejoin failed", "tried", len(missing), "err", err)
			} else if k > 0 {
				n.log.Info("rejoined", "via", k)
			}
		}
		if err := n.book.save(); err != nil {
			n.log.Warn("peer book not saved", "err", err)
		}
		n.ev.expireLeft(time.Now())
		n.tr.accused.expire(time.Now())
		n.ev.expireTokens(time.Now())
		n.renewToken(time.Now())
		n.bw.trim(func(p peer.ID) bool { return n.h.Network().Connectedness(p) == network.Connected })
		n.forgetIdle(time.Now())
	}
}

// ID is the node's peer ID (its memberlist name).
func (n *Node) ID() peer.ID { return n.h.ID() }

// Host is the underlying libp2p host.
func (n *Node) Host() host.Host { return n.h }

// RunID is the run this node belongs to.
func (n *Node) RunID() string { return n.cfg.RunID }

// Addrs returns the node's full multiaddrs (ending in /p2p/<id>), usable as
// another node's Bootstrap entries.
func (n *Node) Addrs() []ma.Multiaddr {
	out, _ := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: n.h.ID(), Addrs: n.h.Addrs()})
	return out
}

// Members returns the current members, this node included: those that
// proved themselves live to this node (Pending lists the others).
func (n *Node) Members() []Member { return n.ev.list(false) }

// Seeds returns the peer IDs of the bootstrap addresses this node was given
// (NodeConfig.Bootstrap): identities it chose to dial, where a member's
// role is only that member's word.
func (n *Node) Seeds() []peer.ID {
	var out []peer.ID
	for _, s := range n.seeds {
		out = append(out, s.ID)
	}
	return out
}

// IsSeed reports whether id is one of the bootstraps this node was told
// to dial (Config.Bootstrap): the only members it takes for the run's
// bootstrap. A member's role in its metadata is its own word; in an open
// run anyone can claim RoleBootstrap.
func (n *Node) IsSeed(id peer.ID) bool { return containsPeer(n.seeds, id) }

// NumMembers counts the current members, this node included.
func (n *Node) NumMembers() int { return n.ev.count() }

// Member returns one member's view.
func (n *Node) Member(id peer.ID) (Member, bool) { return n.ev.get(id) }

// Subscribe returns a subscription that first replays the current members as
// EventJoin, then delivers every change in order.
func (n *Node) Subscribe() *Subscription { return n.ev.subscribe() }

// signedMeta encodes m and signs it with this node's identity and address
// at its next incarnation (metasig.go): the time in nanoseconds, so that a
// restarted node's metadata is newer than what members still hold of it.
// n.metaMu is held (or the node is starting).
func (n *Node) signedMeta(m Meta) ([]byte, error) {
	fields, err := m.MarshalBinary()
	if err != nil {
		return nil, err
	}
	inc := max(n.metaInc+1, uint64(time.Now().UnixNano()))
	b, err := signMeta(n.h.Peerstore().PrivKey(n.h.ID()), inc, n.advIP, n.advPort, fields)
	if err == nil {
		n.metaInc = inc
	}
	return b, err
}

// Meta returns this node's metadata.
func (n *Node) Meta() Meta {
	n.metaMu.Lock()
	defer n.metaMu.Unlock()
	return n.meta
}

// UpdateMeta changes this node's metadata and gossips it, waiting (at most
// 5 s, or until ctx ends) for memberlist to transmit the update. RunID,
// TCPPort and Token cannot be changed (SetToken changes the token).
func (n *Node) UpdateMeta(ctx context.Context, f func(*Meta)) error {
	return n.updateMeta(ctx, keepIdentity(f))
}

// AnnounceMeta is UpdateMeta without the wait: the update is applied and
// queued for gossip, and the call returns at once. A volunteer announces
// its round this way after every round: memberlist sends queued updates on
// its gossip ticks (200 ms apart) and only reports one sent after its
// retransmissions, so waiting held the next inner phase back by 100-400 ms
// a round (3-5% of a demo round), and the others hear it no sooner.
func (n *Node) AnnounceMeta(f func(*Meta)) error {
	// A timeout this short returns once the update is queued.
	return n.broadcastMeta(keepIdentity(f), time.Nanosecond)
}

// keepIdentity wraps a metadata change so that it cannot change what
// identifies the member in the run (RunID, TCPPort, Token).
func keepIdentity(f func(*Meta)) func(*Meta) {
	return func(m *Meta) {
		runID, port, token := m.RunID, m.TCPPort, m.Token
		f(m)
		m.RunID, m.TCPPort, m.Token = runID, port, token
	}
}

// setMeta applies f to this node's metadata and signs the result, which
// memberlist's next alive message carries.
func (n *Node) setMeta(f func(*Meta)) error {
	n.metaMu.Lock()
	defer n.metaMu.Unlock()
	m := n.meta
	f(&m)
	b, err := n.signedMeta(m)
	if err != nil {
		return err
	}
	n.meta = m
	n.md.set(b)
	return nil
}

func (n *Node) updateMeta(ctx context.Context, f func(*Meta)) error {
	// At most 5 s (memberlist's default), sooner if ctx ends sooner: a
	// caller's long deadline (a test's run, minutes away) once held a
	// volunteer here for minutes on a loaded machine.
	timeout := 5 * time.Second
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = max(time.Until(d), time.Millisecond) // 0 would wait for ever
	}
	return n.broadcastMeta(f, timeout)
}

// broadcastMeta applies f and has memberlist gossip the update, waiting at
// most timeout for it to go out. memberlist fails when its broadcast has
// not gone out within the timeout (a loaded machine, many members, or a
// timeout meant to skip the wait). The update is applied and queued all the
// same, and gossip and push/pull carry it: that is not the caller's failure.
func (n *Node) broadcastMeta(f func(*Meta), timeout time.Duration) error {
	if err := n.setMeta(f); err != nil {
		return err
	}
	if err := n.ml.UpdateNode(timeout); err != nil && !strings.Contains(err.Error(), "timeout waiting for update broadcast") {
		return err
	}
	return nil
}

// Close leaves the run gracefully (others see EventLeave, usually before Close
// returns), saves the peer book and stops the host. It usually takes tens of
// milliseconds; at most about 4 s: a goodbye to every member (<= 1 s),
// memberlist's leave broadcast (<= 2 s) and a drain of packets queued to
// connected peers (<= 1 s).
func (n *Node) Close() error {
	var err error
	n.once.Do(func() {
		n.sayGoodbye()
		if e := n.ml.Leave(2 * time.Second); e != nil {
			err = e
		}
		n.tr.drain(time.Second)
		n.stop()
	})
	return err
}

// Shutdown stops the node without leaving, as if the process were killed:
// others declare it failed after the suspicion timeout.
func (n *Node) Shutdown() error {
	n.once.Do(n.stop)
	return nil
}

func (n *Node) stop() {
	n.limitCancel()
	n.shutdown()
	if err := n.book.save(); err != nil {
		n.log.Warn("peer book not saved", "err", err)
	}
	n.closeLanes()
	n.h.Close()
}

func (n *Node) shutdown() {
	if n.cancel != nil {
		n.cancel()
	}
	n.wg.Wait()
	n.ml.Shutdown()
	n.tr.Shutdown()
	n.ev.close()
}

// sayGoodbye tells every member, in parallel and for at most a second, that
// this node is leaving, so they report EventLeave rather than EventFail.
func (n *Node) sayGoodbye() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, m := range n.ev.list(false) {
		if m.ID == n.h.ID() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := n.h.NewStream(network.WithAllowLimitedConn(ctx, "bye"), m.ID, n.byeID)
			if err != nil {
				return
			}
			s.CloseWrite()
			_ = s.SetReadDeadline(time.Now().Add(time.Second))
			var b [1]byte
			s.Read(b[:]) // wait for the remote to close: it has recorded the goodbye
			s.Close()
		}()
	}
	wg.Wait()
}
