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
}

// certTimeout bounds a vote's delivery and a request for a chain.
const certTimeout = 10 * time.Second

// newCerts starts the certificate protocols of pn with the trusted chain
// starting at anchor (or at the certificate saved at path, when it is the
// certificate of anchor's state); vouch judges a certificate adopted
// without an earlier group (replica.Book.Anchorless).
func newCerts(pn *p2p.Node, log *slog.Logger, anchor *replica.Certificate, path string, vouch func(*replica.Certificate) error) (*certs, error) {
	if saved, err := loadCert(path, pn); err == nil && saved.Round == anchor.Round && saved.Hash == anchor.Hash {
		anchor = saved
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Warn("the saved round certificate is not usable; starting the chain at the local state", "path", path, "err", err)
	}
	book := replica.NewBook(pn.RunID(), pn.Signer(), anchor)
	book.Anchorless = vouch
	votes, err := p2p.NewPeers(pn, p2p.ProtoVote, replica.MaxCertBytes, certTimeout)
	if err != nil {
		return nil, err
	}
	c := &certs{book: book, pn: pn, log: log, votes: votes, out: transport.NewOutbox(votes, 8, log), path: path, done: make(chan struct{})}
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
	pid, err := peer.Decode(string(id))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, certTimeout)
	defer cancel()
	frames, err := c.pn.Ask(ctx, pid, p2p.ProtoCerts, certFrames(), replica.ChainRequest(from), replica.ChainPage)
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
// (Anchorless: vouchedByLive). A chain that does not verify is refused and
// its server named. nil when nothing certified lies past round.
func (c *certs) certifiedAhead(ctx context.Context, round uint64, others []announcement) *replica.Certificate {
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
		if errors.Is(err, replica.ErrBrokenChain) && len(chain) > 0 && len(t.Group) > 0 && c.book.Anchorless != nil {
			// Churn and dissent can leave fewer than half of the trusted
			// group among a later round's signers (a straggler left, a
			// hostile member voted for another state): then this member
			// is a newcomer again, and takes the latest certificate only if
			// a strict majority of the volunteers it sees live signed it,
			// half of its trusted group among them (Rejoins: sybils who
			// outnumber the live honest volunteers still hold none of it).
			// (A newcomer, whose chain must extend the bootstrap's anchor,
			// never gets here.)
			latest := chain[len(chain)-1]
			if verr := c.book.Anchorless(latest); verr == nil && latest.Rejoins(t) {
				if err = c.book.Reanchor(latest); err == nil {
					c.log.Info("the trusted chain no longer extends; re-anchored on the live majority's certificate", "round", latest.Round)
					last = latest
				}
			}
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

// vouchedByLive is the rule for a certificate taken without an earlier
// group (a newcomer, or a restart without a saved certificate): a strict
// majority of the other volunteers this member sees live signed it. No
// single member and no fixed number of them decides: sybils must outnumber
// the live honest volunteers in this member's view (where p2p counts only
// members proved live, within the admission caps).
func vouchedByLive(others []announcement, cert *replica.Certificate) error {
	live := make([]transport.PeerID, len(others))
	for i, a := range others {
		live[i] = a.id
	}
	return replica.VouchedBy(live, cert)
}

// bootAnchor is the certificate the bootstrap this member dialled last
// countersigned (p2p.ProtoAnchor), checked against the bootstrap's peer
// ID; nil when no bootstrap answers with one.
func (c *certs) bootAnchor(ctx context.Context) *replica.Certificate {
	for _, id := range c.pn.Seeds() {
		a, err := fetchAnchor(ctx, c.pn, id)
		if err == nil && a != nil {
			if err = a.Verify(c.pn.RunID(), c.pn.Signer(), transport.PeerID(id.String())); err == nil {
				return a.Cert
			}
		}
		if err != nil {
			c.log.Warn("no countersigned round certificate from the bootstrap; a majority of the volunteers seen decides", "bootstrap", id, "err", err)
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
