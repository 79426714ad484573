package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/internal/atomicfile"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/replica"
	"github.com/skein-ml/skein/transport"
)

// certs carries a DiLoCo volunteer's round certificates (replica.Book)
// over the network: after a round, its vote to the round's other members
// (p2p.ProtoVote); its trusted chain to whoever asks (p2p.ProtoCerts); and
// the certificate it last trusted, next to its checkpoint, so a restart
// resumes the chain instead of starting from a bare anchor.
type certs struct {
	book   *replica.Book
	pn     *p2p.Node
	log    *slog.Logger
	votes  *p2p.Peers
	out    *transport.Outbox
	path   string          // the saved certificate; "" = none
	ctx    context.Context // the protocols' life: until close
	cancel context.CancelFunc
	// forged is served after the chain (HostileLoneJump, chaos tests only).
	forged atomic.Pointer[replica.Certificate]
	// sybils collects fellow sybils' votes for sybilRound (HostileSybils).
	sybils sybilVotes
	done   chan struct{}
	// sybil: this volunteer plays HostileSybils (chaos tests only).
	sybil atomic.Bool
	// seen remembers the volunteers seen live for a while: the rules
	// that count "a majority of the volunteers seen live" count them
	// (replica.Witnesses).
	seen *replica.Witnesses
	// live lists the other volunteers live now; nil = no rule counts
	// them (tests of the chain alone).
	live func() []transport.PeerID
}

// certTimeout bounds a vote's delivery and a request for a chain.
const certTimeout = 10 * time.Second

// newCerts starts the certificate protocols of pn with the trusted chain
// starting at anchor (or at the certificate saved at path, when it is the
// certificate of anchor's state); live lists the other volunteers live now,
// whose strict majority (with those seen within replica.WitnessWindow)
// must sign a certificate taken without an earlier group or across a
// broken chain (nil: none is taken so).
func newCerts(pn *p2p.Node, log *slog.Logger, anchor *replica.Certificate, path string, live func() []transport.PeerID) (*certs, error) {
	if saved, err := loadCert(path, pn); err == nil && saved.Round == anchor.Round && saved.Hash == anchor.Hash {
		anchor = saved
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Warn("the saved round certificate is not usable; starting the chain at the local state", "path", path, "err", err)
	}
	book := replica.NewBook(pn.RunID(), pn.Signer(), anchor)
	seen := replica.NewWitnesses(replica.WitnessWindow)
	if live != nil {
		book.Anchorless = func(c *replica.Certificate) error {
			return replica.VouchedBy(seen.Observe(time.Now(), live()), c)
		}
	}
	votes, err := p2p.NewPeers(pn, p2p.ProtoVote, replica.MaxCertBytes, certTimeout)
	if err != nil {
		return nil, err
	}
	c := &certs{book: book, pn: pn, log: log, votes: votes, out: transport.NewOutbox(votes, 8, log), path: path, done: make(chan struct{}), seen: seen, live: live}
	if err := pn.Handle(p2p.ProtoCerts, certFrames(), c.serve); err != nil {
		votes.Close()
		return nil, err
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	go c.receive(c.ctx)
	return c, nil
}

// certFrames bounds the certificate protocols' frames.
func certFrames() p2p.FrameConfig { return p2p.MessageFrameConfig(replica.MaxCertBytes) }

// close stops the protocols.
func (c *certs) close() {
	c.cancel()
	<-c.done
	c.out.Wait()
	c.votes.Close()
	c.pn.Unhandle(p2p.ProtoCerts)
}

// receive takes the others' votes until ctx ends.
func (c *certs) receive(ctx context.Context) {
	defer close(c.done)
	for {
		m, err := c.votes.Recv(ctx)
		if err != nil {
			return
		}
		var v replica.Certificate
		if err := v.UnmarshalBinary(m.Payload); err != nil {
			c.log.Warn("malformed vote", "from", m.From, "err", err)
			continue
		}
		if c.sybil.Load() && v.Round == sybilRound {
			c.sybils.take(&v, m.From) // a fellow sybil's signature
			continue
		}
		formed, err := c.book.AddVote(&v, m.From)
		if err != nil {
			c.log.Warn("vote refused", "from", m.From, "round", v.Round, "err", err)
			continue
		}
		if formed != nil {
			c.save(formed)
		}
	}
}

// vote signs this member's vote for the state hash it ended round in, as
// a member of group, and queues it for the group's other members (sent
// until close). A member left out of the round (not in group) does not
// vote.
func (c *certs) vote(round, hash uint64, group []transport.PeerID) {
	self := transport.PeerID(c.pn.ID().String())
	if !slices.Contains(group, self) {
		return
	}
	v, err := c.book.Vote(round, hash, group, self, c.pn.Sign)
	if err != nil {
		c.log.Warn("could not vote", "round", round, "err", err)
		return
	}
	b, err := v.MarshalBinary()
	if err != nil {
		c.log.Warn("could not vote", "round", round, "err", err)
		return
	}
	if t := c.book.Trusted(); t.Round == round {
		c.save(t) // a group of one (or the last vote was ours)
	}
	for _, id := range v.Group {
		if id != self {
			c.out.Send(c.ctx, id, b)
		}
	}
}

// serve answers ProtoCerts: the trusted certificates after the asked round.
func (c *certs) serve(_ context.Context, s *p2p.Stream) error {
	_, req, err := s.ReadFrame()
	if err != nil {
		return err
	}
	from, err := replica.ParseChainRequest(req)
	if err != nil {
		return err
	}
	chain := c.book.Chain(from, replica.ChainPage)
	if f := c.forged.Load(); f != nil && len(chain) < replica.ChainPage {
		chain = append(chain, f)
	}
	for _, cert := range chain {
		b, err := cert.MarshalBinary()
		if err != nil {
			return err
		}
		if err := s.WriteFrame(1, b); err != nil {
			return err
		}
	}
	return nil
}

// fetch asks id for its trusted certificates after round from.
func (c *certs) fetch(ctx context.Context, id transport.PeerID, from uint64) ([]*replica.Certificate, error) {
	return fetchChain(ctx, c.pn, id, from)
}

// fetchChain asks id for its trusted certificates after round from
// (p2p.ProtoCerts).
func fetchChain(ctx context.Context, pn *p2p.Node, id transport.PeerID, from uint64) ([]*replica.Certificate, error) {
	pid, err := peer.Decode(string(id))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, certTimeout)
	defer cancel()
	frames, err := pn.Ask(ctx, pid, p2p.ProtoCerts, certFrames(), replica.ChainRequest(from), replica.ChainPage)
	if err != nil {
		return nil, err
	}
	return replica.DecodeChain(frames)
}

// save keeps cert next to the checkpoint (best effort: a lost file only
// means a restart starts its chain from a bare anchor).
func (c *certs) save(cert *replica.Certificate) {
	if c.path == "" {
		return
	}
	b, err := cert.MarshalBinary()
	if err == nil {
		err = atomicfile.WriteFile(c.path, b, 0o644)
	}
	if err != nil {
		c.log.Warn("could not save the round certificate", "path", c.path, "err", err)
	}
}

// loadCert reads and verifies the certificate saved at path.
func loadCert(path string, pn *p2p.Node) (*replica.Certificate, error) {
	if path == "" {
		return nil, os.ErrNotExist
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) > replica.MaxCertBytes {
		return nil, fmt.Errorf("%w: %d bytes", replica.ErrBadCert, len(b))
	}
	c := new(replica.Certificate)
	if err := c.UnmarshalBinary(b); err != nil {
		return nil, err
	}
	if err := c.Verify(pn.RunID(), pn.Signer()); err != nil {
		return nil, err
	}
	return c, nil
}

// certifiedAhead returns the latest certified state past round that this
// member's trusted chain leads to: it asks the members announcing a later
// round than it trusts (members of its trusted group first, then the
// latest; at most three, until one answers with a chain that verifies and
// extends its own) for their certificates, page after page. A member
// whose anchor has no group (a newcomer) checks the chain from the
// certificate the bootstrap it dialled countersigned (bootAnchor), or,
// while no bootstrap answers with one, takes the latest certificate only
// (Anchorless: a strict majority of the volunteers seen live signed it). A chain that does not verify is refused and
// its server named. nil when nothing certified lies past round.
func (c *certs) certifiedAhead(ctx context.Context, round uint64, others []announcement) *replica.Certificate {
	c.seen.Observe(time.Now(), ids(others))
	t := c.book.Trusted()
	ahead := slices.DeleteFunc(slices.Clone(others), func(a announcement) bool { return a.round <= max(round, t.Round) || a.hash == 0 })
	var boot *replica.Certificate
	if len(t.Group) == 0 && len(ahead) > 0 {
		boot = c.bootAnchor(ctx)
	}
	// Only a majority of the trusted group (boot's, for a newcomer) can
	// extend the chain: its members are asked first, so that sybils
	// announcing far rounds do not take every turn.
	group := t.Group
	if boot != nil {
		group = boot.Group
	}
	// Then the members at the round most announce, before those far
	// ahead of it (sybils at far rounds would take every turn of a member
	// without a group).
	var rounds []uint64
	for _, a := range ahead {
		rounds = append(rounds, a.round)
	}
	usual := replica.MedianRound(rounds)
	rank := func(a announcement) int {
		if _, ok := slices.BinarySearch(group, a.id); ok {
			return 0
		}
		if a.round <= usual+1 {
			return 1
		}
		return 2
	}
	slices.SortFunc(ahead, func(a, b announcement) int {
		return cmp.Or(cmp.Compare(rank(a), rank(b)), cmp.Compare(b.round, a.round), cmp.Compare(a.id, b.id))
	})
	for _, a := range ahead[:min(3, len(ahead))] {
		if c.follow(ctx, a, boot) {
			break
		}
	}
	if t = c.book.Trusted(); t.Round > round {
		return t
	}
	return nil
}

// follow takes a's chain, page by page (a few at most), from boot when
// this member's anchor has no group and the bootstrap countersigned one,
// and says whether it led anywhere.
func (c *certs) follow(ctx context.Context, a announcement, boot *replica.Certificate) bool {
	moved := false
	for range 8 {
		t := c.book.Trusted()
		from := t.Round
		if len(t.Group) == 0 && boot != nil {
			from = boot.Round
		} else if len(t.Group) == 0 && a.round > 0 {
			// Only the latest certificate counts (Adopt): a page that ends
			// at it, whether or not a's announced round is certified yet.
			from = max(from, a.round-min(a.round, replica.ChainPage))
		}
		chain, err := c.fetch(ctx, a.id, from)
		if err != nil {
			c.log.Debug("no certificates from a member ahead", "peer", a.id, "err", err)
			return moved
		}
		last, err := c.book.AdoptFrom(boot, chain)
		if errors.Is(err, replica.ErrBrokenChain) && len(chain) > 0 && len(t.Group) > 0 {
			last, err = c.rejoin(ctx, chain)
		}
		if err != nil {
			c.log.Warn("offender: a member's certificates do not extend the trusted chain", "peer", a.id, "round", a.round, "err", err)
			return moved
		}
		if last.Round == t.Round {
			return moved
		}
		moved = true
		c.save(last)
		if len(chain) < replica.ChainPage {
			return true
		}
	}
	return moved
}

// rejoin takes chain, which does not extend the trusted chain (churn and
// dissent left fewer than half of the trusted group among a later round's
// signers): through the anchor the bootstrap countersigned, when it is past
// the trusted round (the chain must extend it); else, this member being a
// newcomer again, its latest certificate when at least half of the trusted
// group and a strict majority of the volunteers seen live within the
// witness window signed it (replica.Book.Rejoin).
func (c *certs) rejoin(ctx context.Context, chain []*replica.Certificate) (*replica.Certificate, error) {
	t := c.book.Trusted()
	if boot := c.bootAnchor(ctx); boot != nil && boot.Round > t.Round {
		last, err := c.book.AdoptFrom(boot, chain)
		if err == nil {
			c.log.Info("the trusted chain no longer extends; re-anchored on the bootstrap's certificate", "round", boot.Round)
		}
		return last, err
	}
	if c.live == nil {
		return nil, fmt.Errorf("%w: at round %d", replica.ErrBrokenChain, t.Round)
	}
	latest := chain[len(chain)-1]
	if err := c.book.Rejoin(latest, c.seen.Observe(time.Now(), c.live())); err != nil {
		return nil, fmt.Errorf("%w: not re-anchored: %w", replica.ErrBrokenChain, err)
	}
	c.log.Info("the trusted chain no longer extends; re-anchored on the certificate of the volunteers seen live", "round", latest.Round)
	return latest, nil
}

// holders are the members that can serve cert's state: those announcing
// it, then its other signers.
func holders(cert *replica.Certificate, others []announcement) []transport.PeerID {
	var ids []transport.PeerID
	for _, a := range others {
		if a.round == cert.Round && a.hash == cert.Hash {
			ids = append(ids, a.id)
		}
	}
	for _, id := range cert.Signers() {
		if !slices.Contains(ids, id) && slices.ContainsFunc(others, func(a announcement) bool { return a.id == id }) {
			ids = append(ids, id)
		}
	}
	return ids
}

// ids are the announcers' peer IDs.
func ids(others []announcement) []transport.PeerID {
	out := make([]transport.PeerID, len(others))
	for i, a := range others {
		out[i] = a.id
	}
	return out
}

// bootAnchor is the certificate the bootstrap this member dialled last
// countersigned (certifiedByBootstrap).
func (c *certs) bootAnchor(ctx context.Context) *replica.Certificate {
	return certifiedByBootstrap(ctx, c.pn, c.log)
}

// certifiedByBootstrap is the certificate a bootstrap pn dialled
// countersigned (p2p.ProtoAnchor), checked against the bootstrap's peer ID;
// nil when no bootstrap answers with one.
func certifiedByBootstrap(ctx context.Context, pn *p2p.Node, log *slog.Logger) *replica.Certificate {
	for _, id := range pn.Seeds() {
		a, err := fetchAnchor(ctx, pn, id)
		if err == nil && a != nil {
			if err = a.Verify(pn.RunID(), pn.Signer(), transport.PeerID(id.String())); err == nil {
				return a.Cert
			}
		}
		if err != nil {
			log.Warn("no countersigned round certificate from the bootstrap", "bootstrap", id, "err", err)
		}
	}
	return nil
}

// fetchAnchor asks the bootstrap id for its anchor; nil while it has none.
func fetchAnchor(ctx context.Context, pn *p2p.Node, id peer.ID) (*replica.Anchor, error) {
	ctx, cancel := context.WithTimeout(ctx, certTimeout)
	defer cancel()
	s, err := pn.Open(ctx, id, p2p.ProtoAnchor, p2p.MessageFrameConfig(replica.MaxAnchorBytes))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	_, b, err := s.ReadFrame()
	if err != nil || len(b) == 0 {
		s.Reset()
		return nil, err
	}
	a := new(replica.Anchor)
	return a, a.UnmarshalBinary(b)
}
