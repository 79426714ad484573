package p2p

import (
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// Enforcement of the admission policy (admission.go describes the policy
// and the token format): the member table (events), the stream gate, the
// admission handshake and the seed's relay.

// Bounds of the door: the peers the admission handshake let in (closed
// runs), whose streams the gate accepts before they are members.
const (
	// doorTTL: a peer admitted at the door may open streams this long
	// before it must be a member (or knock again). Membership takes a
	// second or two; a node re-presents itself every introTTL.
	doorTTL = 10 * time.Minute
	// introTTL: a node presents itself again to a peer after this long.
	introTTL = doorTTL / 2
	// maxDoor bounds the door table and the table of introductions: 4x the
	// members a node is sized for, like maxLeftAt. Only holders of a valid
	// token get in, so the table is fed by the operator's tokens, not by
	// strangers; when full the entry that expires first goes.
	maxDoor = 1024
	// selfTokenTTL is the life of the token a node holding the run key
	// issues itself; it renews it when half is left.
	selfTokenTTL = 24 * time.Hour
)

// errLearning refuses members while a node does not know its run's
// admission policy yet.
var errLearning = errors.New("p2p: admission policy not known yet")

// NotAdmittedError is a refusal of this node: by a peer it joins through
// (the admission handshake), or by the node itself when its own token does
// not pass the run's policy. It matches ErrNotAdmitted and Err.
type NotAdmittedError struct {
	Self  peer.ID // this node
	RunID string
	By    peer.ID // the peer that refused; "" when the node refused its own token
	Err   error   // why: ErrTokenMissing, ErrTokenExpired, ..., ErrRunFull, ErrPrefixFull
}

func (e *NotAdmittedError) Error() string {
	by := "by its own check"
	if e.By != "" {
		by = "at the door of peer " + e.By.String()
	}
	msg := fmt.Sprintf("p2p: run %q refused this node (peer ID %s) %s: %v", e.RunID, e.Self, by, e.Err)
	if IsTokenError(e.Err) {
		msg += fmt.Sprintf(" (ask the run's operator for a join token for peer ID %s)", e.Self)
	}
	return msg
}

// Unwrap returns ErrNotAdmitted and the reason.
func (e *NotAdmittedError) Unwrap() []error { return []error{ErrNotAdmitted, e.Err} }

// IsTokenError reports whether err is about a join token (missing,
// malformed, forged, expired, for another peer, run or role): the remedy
// is a new token.
func IsTokenError(err error) bool {
	for _, s := range []error{ErrTokenMissing, ErrTokenMalformed, ErrTokenForged, ErrTokenExpired, ErrTokenWrongPeer, ErrTokenWrongRun, ErrTokenWrongRole} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// policy returns the admission policy and whether it is still being
// learned.
func (e *events) policy() (Admission, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.adm, e.learning
}

// Admission returns the run's admission policy as this node enforces it:
// the one it was configured with, or the one it learned from the peer
// that admitted it; ok is false while it is still learning.
func (n *Node) Admission() (a Admission, ok bool) {
	a, learning := n.ev.policy()
	return a, !learning
}

// setPolicy sets the admission policy (learning ends).
func (e *events) setPolicy(a Admission) {
	e.mu.Lock()
	e.adm, e.learning = a, false
	e.mu.Unlock()
}

// admit checks n: its metadata signed by its own key (metasig.go), of this
// run, and in a closed run a token signed by the run key for n, this run
// and the role n claims, not expired at now. until is the token's expiry
// (zero in an open run). An error matching ErrTokenExpired still returns
// the member.
func (e *events) admit(n *memberlist.Node, now time.Time) (Member, time.Time, error) {
	m, err := e.decode(n)
	if err != nil {
		return Member{}, time.Time{}, err
	}
	adm, learning := e.policy()
	switch {
	case m.ID == e.self:
		return m, time.Time{}, nil
	case learning:
		return Member{}, time.Time{}, fmt.Errorf("%w: member %s", errLearning, m.ID)
	case !adm.Closed:
		return m, time.Time{}, nil
	}
	t, err := VerifyToken(adm.RunKey, []byte(m.Meta.Token), m.ID, e.runID, now)
	if errors.Is(err, ErrTokenExpired) {
		tok, _ := ParseToken([]byte(m.Meta.Token))
		return m, tok.Expires, fmt.Errorf("%w: member %s: %w", ErrNotAdmitted, m.ID, err)
	}
	if err != nil {
		return Member{}, time.Time{}, fmt.Errorf("%w: member %s: %w", ErrNotAdmitted, m.ID, err)
	}
	if t.Role != m.Meta.Role {
		return Member{}, time.Time{}, fmt.Errorf("%w: member %s claims role %s with a token for %s: %w", ErrNotAdmitted, m.ID,
			m.Meta.Role, t.Role, ErrTokenWrongRole)
	}
	return m, t.Expires, nil
}

// checkCaps refuses a newcomer past the policy's caps: MaxMembers, and in
// an open run MaxPerPrefix, counted over the members that count, the
// newcomer's prefix taken from its direct connection to this node. A
// newcomer without one is let in as pending (it counts once it connects,
// within the caps then: promote), unless maxPending are pending already.
// Members, this node and its seeds pass.
func (e *events) checkCaps(m Member) error {
	if m.ID == e.self {
		return nil
	}
	e.promote() // the members connected by now count against the caps
	ip, direct := e.measure(m)
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, known := e.members[m.ID]; known || e.exempt[m.ID] {
		return nil
	}
	if direct {
		return e.capsLocked(m.ID, ip, now)
	}
	if pending := len(e.members) - len(e.live); pending >= maxPending {
		return fmt.Errorf("%w: %s refused: %w (%d members pending)", ErrNotAdmitted, m.ID, ErrRunFull, pending)
	}
	return nil
}

// maxPending bounds the members that have not proved themselves live, the
// members a node is sized for (DefaultLimits' ConnHigh): ghosts announced
// by a host that never joins fill at most that, and a newcomer past it
// still gets in once it connects (checkCaps).
const maxPending = 256

// capsLocked checks the caps for id behind ip against the members that
// count; e.mu is held.
func (e *events) capsLocked(id peer.ID, ip net.IP, now time.Time) error {
	adm := e.adm
	perPrefix := adm.MaxPerPrefix
	if adm.Closed {
		perPrefix = 0
	}
	if id == e.self || e.exempt[id] || adm.MaxMembers == 0 && perPrefix == 0 {
		return nil
	}
	counted, same, p := 0, 0, adm.prefix(ip)
	for o, oip := range e.live {
		if o != id && e.liveLocked(o, now) {
			counted++
			if adm.prefix(oip) == p {
				same++
			}
		}
	}
	if adm.MaxMembers > 0 && counted >= adm.MaxMembers {
		return fmt.Errorf("%w: %s refused: %w (%d)", ErrNotAdmitted, id, ErrRunFull, adm.MaxMembers)
	}
	if perPrefix > 0 && same >= perPrefix {
		return fmt.Errorf("%w: %s refused: %w (%d behind %s)", ErrNotAdmitted, id, ErrPrefixFull, perPrefix, p)
	}
	return nil
}

// promote counts the pending members that proved themselves live: a
// direct connection to this node (not relayed), within the caps, their
// prefix taken from that connection. Until then a member is pending: it
// does not count for groups, majorities or caps. A member counts until it
// leaves or fails.
func (e *events) promote() {
	e.mu.Lock()
	var pending []Member
	for id, m := range e.members {
		if _, ok := e.live[id]; !ok {
			pending = append(pending, m)
		}
	}
	e.mu.Unlock()
	for _, m := range pending {
		ip, ok := e.measure(m) // outside the lock: it asks the host for connections
		if !ok {
			continue
		}
		now := time.Now()
		e.mu.Lock()
		_, member := e.members[m.ID]
		_, done := e.live[m.ID]
		if member && !done {
			if err := e.capsLocked(m.ID, ip, now); err != nil {
				e.log.Debug("member stays pending", "member", m.ID, "err", err)
			} else {
				e.live[m.ID] = ip
			}
		}
		e.mu.Unlock()
	}
}

// measure returns the IP m's prefix is taken from and whether m proved
// itself live: this node itself, or a direct connection (e.direct).
func (e *events) measure(m Member) (net.IP, bool) {
	if m.ID == e.self || e.direct == nil {
		return announcedIP(m.Addr), true
	}
	return e.direct(m.ID, m.Addr)
}

func announcedIP(addr string) net.IP {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	return net.ParseIP(h)
}

// expireTokens reports members whose token expired before now as failed.
func (e *events) expireTokens(now time.Time) {
	e.mu.Lock()
	var gone []Member
	for id, u := range e.until {
		if !now.Before(u) {
			gone = append(gone, e.members[id])
		}
	}
	e.mu.Unlock()
	for _, m := range gone {
		e.log.Info("member's join token expired", "member", m.ID)
		e.emit(EventFail, m)
	}
}

// knock is the door's side of the admission handshake: it checks the token
// a peer presents (closed run) or the caps (open run) and, in a closed
// run, lets the peer's streams through the gate for doorTTL.
func (e *events) knock(id peer.ID, addr string, token []byte, now time.Time) error {
	adm, learning := e.policy()
	if learning {
		return errLearning
	}
	m := Member{ID: id, Addr: addr}
	if !adm.Closed {
		return e.checkCaps(m)
	}
	t, err := VerifyToken(adm.RunKey, token, id, e.runID, now)
	if err != nil {
		return err
	}
	if err := e.checkCaps(m); err != nil {
		return err
	}
	until := now.Add(doorTTL)
	if t.Expires.Before(until) {
		until = t.Expires
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.door[id]; !ok && len(e.door) >= maxDoor {
		evictFirst(e.door, now)
	}
	e.door[id] = until
	return nil
}

// evictFirst removes the expired entries of t, or if none the one that
// expires first.
func evictFirst(t map[peer.ID]time.Time, now time.Time) {
	var first peer.ID
	var at time.Time
	for id, u := range t {
		if !now.Before(u) {
			delete(t, id)
			continue
		}
		if first == "" || u.Before(at) {
			first, at = id, u
		}
	}
	if len(t) >= maxDoor && first != "" {
		delete(t, first)
	}
}

// admitted reports whether id may open streams on the run's protocols: in
// a closed run this node, a member, or a peer let in at the door lately;
// in an open run (or while learning) anyone.
func (e *events) admitted(id peer.ID, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.learning || !e.adm.Closed || id == e.self {
		return true
	}
	if _, ok := e.members[id]; ok && e.liveLocked(id, now) {
		return true
	}
	u, ok := e.door[id]
	if ok && !now.Before(u) {
		delete(e.door, id)
		return false
	}
	return ok
}

// The admission handshake, /skein/<run>/admission/1: the asker sends one
// frame of type admissionAsk,
//
//	offset  size  field
//	0       1     n, the length of the asker's memberlist address, 0..64
//	1       n     that address, "ip:port" (its prefix, when it connects
//	              from loopback)
//	1+n     rest  its token, 0..MaxTokenLen bytes (none in an open run)
//
// and the door answers one frame of type admissionAnswer:
//
//	offset  size  field
//	0       1     verdict: 0 admitted, else the reason (admissionReasons)
//	1       1     mode: 0 open, 1 closed
//	2       32    run key (zero in an open run)
//	34      4     MaxMembers, big endian
//	38      4     MaxPerPrefix, big endian
//	42      1     PrefixV4
//	43      1     PrefixV6
const (
	admissionAsk    = 1
	admissionAnswer = 2
	admissionLen    = 44
	maxAskAddr      = 64
)

// admissionReasons maps verdicts to errors; verdict i is entry i-1.
var admissionReasons = []error{ErrTokenMissing, ErrTokenMalformed, ErrTokenForged, ErrTokenExpired, ErrTokenWrongPeer,
	ErrTokenWrongRun, ErrTokenWrongRole, ErrRunFull, ErrPrefixFull, errLearning}

func admissionFrameConfig() FrameConfig { return MessageFrameConfig(1 + maxAskAddr + MaxTokenLen) }

func encodeAnswer(verdict error, a Admission) []byte {
	b := make([]byte, admissionLen)
	if verdict != nil {
		b[0] = byte(len(admissionReasons) + 1) // unknown: refused
		for i, r := range admissionReasons {
			if errors.Is(verdict, r) {
				b[0] = byte(i + 1)
				break
			}
		}
	}
	if a.Closed {
		b[1] = 1
		copy(b[2:34], a.RunKey)
	}
	binary.BigEndian.PutUint32(b[34:], uint32(a.MaxMembers))
	binary.BigEndian.PutUint32(b[38:], uint32(a.MaxPerPrefix))
	b[42], b[43] = byte(a.PrefixV4), byte(a.PrefixV6)
	return b
}

// answer is a door's answer: its policy and its verdict (nil: admitted).
type answer struct {
	adm     Admission
	verdict error
}

// decodeAnswer decodes a door's answer; it never panics.
func decodeAnswer(b []byte) (answer, error) {
	if len(b) != admissionLen || b[1] > 1 {
		return answer{}, fmt.Errorf("%w: admission answer of %d bytes", ErrBadFrame, len(b))
	}
	a := Admission{Closed: b[1] == 1, MaxMembers: int(binary.BigEndian.Uint32(b[34:])),
		MaxPerPrefix: int(binary.BigEndian.Uint32(b[38:])), PrefixV4: int(b[42]), PrefixV6: int(b[43])}
	if a.Closed {
		a.RunKey = ed25519.PublicKey(append([]byte(nil), b[2:34]...))
	}
	if err := a.Validate(); err != nil {
		return answer{}, fmt.Errorf("%w: admission answer: %v", ErrBadFrame, err)
	}
	var verdict error
	switch v := int(b[0]); {
	case v == 0:
	case v <= len(admissionReasons):
		verdict = admissionReasons[v-1]
	default:
		verdict = fmt.Errorf("refused for a reason this version does not know (%d)", v)
	}
	return answer{adm: a, verdict: verdict}, nil
}

// handleAdmission is the door: it answers anyone, once per stream.
func (n *Node) handleAdmission(s network.Stream) {
	if err := s.Scope().SetService("skein.admission"); err != nil {
		s.Reset()
		return
	}
	fs := NewFrameStream(s, admissionFrameConfig())
	typ, b, err := fs.ReadFrame()
	if err != nil || typ != admissionAsk || len(b) < 1 || int(b[0]) > maxAskAddr || len(b) < 1+int(b[0]) {
		s.Reset()
		return
	}
	addr, tok := string(b[1:1+b[0]]), b[1+b[0]:]
	from := s.Conn().RemotePeer()
	verdict := n.ev.knock(from, addr, tok, time.Now())
	if verdict != nil {
		n.log.Debug("refused at the door", "peer", from, "err", verdict)
	}
	adm, _ := n.ev.policy()
	if err := fs.WriteFrame(admissionAnswer, encodeAnswer(verdict, adm)); err != nil {
		s.Reset()
		return
	}
	s.Close()
}

// ask presents this node's token to id and returns id's policy; a refusal
// is a *NotAdmittedError.
func (n *Node) ask(ctx context.Context, id peer.ID) (Admission, error) {
	s, err := n.h.NewStream(network.WithAllowLimitedConn(ctx, "admission"), id, n.admID)
	if err != nil {
		return Admission{}, fmt.Errorf("p2p: admission handshake with %s: %w", id, err)
	}
	defer s.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(d)
	}
	fs := NewFrameStream(s, admissionFrameConfig())
	addr := net.JoinHostPort(n.tr.advIP.String(), strconv.Itoa(n.tr.advPort))
	ask := append([]byte{byte(len(addr))}, addr...)
	if err := fs.WriteFrame(admissionAsk, append(ask, n.ownToken()...)); err != nil {
		s.Reset()
		return Admission{}, fmt.Errorf("p2p: admission handshake with %s: %w", id, err)
	}
	typ, b, err := fs.ReadFrame()
	if err == nil && typ != admissionAnswer {
		err = fmt.Errorf("%w: frame type %d", ErrBadFrame, typ)
	}
	if err != nil {
		s.Reset()
		return Admission{}, fmt.Errorf("p2p: admission handshake with %s: %w", id, err)
	}
	ans, err := decodeAnswer(b)
	if err != nil {
		return Admission{}, fmt.Errorf("p2p: admission handshake with %s: %w", id, err)
	}
	if errors.Is(ans.verdict, errLearning) {
		return Admission{}, fmt.Errorf("p2p: %s is still joining", id)
	}
	if ans.verdict != nil {
		return ans.adm, &NotAdmittedError{Self: n.h.ID(), RunID: n.cfg.RunID, By: id, Err: ans.verdict}
	}
	return ans.adm, nil
}

// learn takes the policy of a peer that admitted this node: the first one
// while learning; later ones are only compared.
func (n *Node) learn(adm Admission, from peer.ID) error {
	n.admMu.Lock()
	defer n.admMu.Unlock()
	cur, learning := n.ev.policy()
	if !learning {
		if !cur.Equal(adm) {
			n.log.Warn("a peer states another admission policy; keeping this node's", "peer", from, "theirs", adm, "ours", cur)
		}
		return nil
	}
	if err := n.checkOwnToken(adm); err != nil {
		return err
	}
	n.ev.setPolicy(adm)
	n.log.Info("admission policy learned", "from", from, "policy", adm)
	return nil
}

// checkOwnToken checks this node's token against adm, as every member will.
func (n *Node) checkOwnToken(adm Admission) error {
	if !adm.Closed {
		return nil
	}
	t, err := VerifyToken(adm.RunKey, n.ownToken(), n.h.ID(), n.cfg.RunID, time.Now())
	if err == nil && t.Role != n.Meta().Role {
		err = fmt.Errorf("%w: token for %s, this node is a %s", ErrTokenWrongRole, t.Role, n.Meta().Role)
	}
	if err != nil {
		return &NotAdmittedError{Self: n.h.ID(), RunID: n.cfg.RunID, Err: err}
	}
	return nil
}

func (n *Node) ownToken() []byte { return []byte(n.Meta().Token) }

// introduce presents this node at id's door before its first membership
// message to id in a closed run, so that id's gate lets it through before
// the gossip about it arrives there. Each peer is asked again after
// introTTL.
func (n *Node) introduce(ctx context.Context, id peer.ID) error {
	adm, learning := n.ev.policy()
	if learning || !adm.Closed || id == n.h.ID() {
		return nil
	}
	now := time.Now()
	n.introMu.Lock()
	at, ok := n.intros[id]
	n.introMu.Unlock()
	if ok && now.Before(at) {
		return nil
	}
	if _, err := n.ask(ctx, id); err != nil {
		return err
	}
	n.introMu.Lock()
	if _, ok := n.intros[id]; !ok && len(n.intros) >= maxDoor {
		evictFirst(n.intros, now)
	}
	n.intros[id] = now.Add(introTTL)
	n.introMu.Unlock()
	return nil
}

// gate wraps a run protocol's handler: in a closed run, a stream from a
// peer that is not admitted (events.admitted) is reset before the handler
// sees it.
func (n *Node) gate(pid protocol.ID, h network.StreamHandler) network.StreamHandler {
	return func(s network.Stream) {
		from := s.Conn().RemotePeer()
		if !n.ev.admitted(from, time.Now()) {
			n.log.Debug("stream from a peer not admitted refused", "protocol", pid, "peer", from)
			s.Reset()
			return
		}
		h(s)
	}
}

// directIP returns the remote IP of a direct connection (not relayed, not
// limited) to id, and false when there is none: a connection authenticated
// by id's key proves id live, which gossip cannot. On loopback (a node on
// this machine, whose dial may leave from any local address) a loopback
// address id announces is taken, so that tests can put nodes behind
// 127.0.0.x; any other announced address never is.
func (n *Node) directIP(id peer.ID, addr string) (net.IP, bool) {
	for _, c := range n.h.Network().ConnsToPeer(id) {
		if c.Stat().Limited {
			continue
		}
		if _, err := c.RemoteMultiaddr().ValueForProtocol(ma.P_CIRCUIT); err == nil {
			continue
		}
		ip, err := manet.ToIP(c.RemoteMultiaddr())
		if err != nil {
			continue
		}
		if a := announcedIP(addr); ip.IsLoopback() && a != nil && a.IsLoopback() {
			return a, true
		}
		return ip, true
	}
	return nil, false
}

// Pending returns the members that have not proved themselves live to this
// node yet (events.promote): gossip names them, but they count for nothing.
func (n *Node) Pending() []Member { return n.ev.list(true) }

// relayACL lets a seed's relay serve admitted peers only (closed runs).
type relayACL struct {
	allow atomic.Pointer[func(peer.ID) bool]
}

func (a *relayACL) ok(p peer.ID) bool {
	f := a.allow.Load()
	return f == nil || (*f)(p)
}

// AllowReserve is relayv2's ACLFilter.
func (a *relayACL) AllowReserve(p peer.ID, _ ma.Multiaddr) bool { return a.ok(p) }

// AllowConnect is relayv2's ACLFilter.
func (a *relayACL) AllowConnect(src peer.ID, _ ma.Multiaddr, dest peer.ID) bool {
	return a.ok(src) && a.ok(dest)
}

// SetToken replaces this node's join token (a renewed one) and gossips it.
// In a closed run it must pass the run's policy.
func (n *Node) SetToken(ctx context.Context, token []byte) error {
	if len(token) > MaxTokenLen {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrTokenMalformed, len(token), MaxTokenLen)
	}
	adm, learning := n.ev.policy()
	if !learning && adm.Closed {
		t, err := VerifyToken(adm.RunKey, token, n.h.ID(), n.cfg.RunID, time.Now())
		if err == nil && t.Role != n.Meta().Role {
			err = ErrTokenWrongRole
		}
		if err != nil {
			return &NotAdmittedError{Self: n.h.ID(), RunID: n.cfg.RunID, Err: err}
		}
	}
	return n.updateMeta(ctx, func(m *Meta) { m.Token = string(token) })
}

// renewToken reissues this node's token when it holds the run key and half
// of the token's life is gone.
func (n *Node) renewToken(now time.Time) {
	if n.cfg.RunKey == nil {
		return
	}
	t, err := ParseToken(n.ownToken())
	if err == nil && t.Expires.Sub(now) > selfTokenTTL/2 {
		return
	}
	tok, err := n.issueOwnToken(now)
	if err == nil {
		err = n.SetToken(n.ctx, tok)
	}
	if err != nil && n.ctx.Err() == nil {
		n.log.Warn("join token not renewed", "err", err)
	}
}

// issueOwnToken signs a token for this node with the run key it holds.
func (n *Node) issueOwnToken(now time.Time) ([]byte, error) {
	return IssueToken(n.cfg.RunKey, Token{Peer: n.h.ID(), RunID: n.cfg.RunID, Role: n.cfg.Meta.Role, Expires: now.Add(selfTokenTTL)})
}
