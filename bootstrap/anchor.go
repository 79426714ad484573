package bootstrap

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/internal/atomicfile"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/replica"
	"github.com/skein-ml/skein/transport"
)

// anchors follows a whole-model DiLoCo run's chain of round certificates
// and countersigns the latest it trusts (replica.Anchor), served on
// p2p.ProtoAnchor: a newcomer checks the announcers' chain from it instead
// of trusting the volunteers it happens to see. The bootstrap does not
// vote. Its first certificate is one a strict majority of the volunteers
// it sees live, or saw within replica.WitnessWindow, signed
// (replica.VouchedBy, a newcomer's rule); from there it takes only chains
// that extend its own (replica.Book.Adopt), asking a few volunteers ahead
// of it every anchorInterval, or, where churn broke the chain, one the
// same majority and half of its trusted group signed (replica.Book.Rejoin). Its certificates are also
// the status page's certified states (status.StoreConfig.Certified).
type anchors struct {
	book *replica.Book
	log  *slog.Logger
	node *p2p.Node // set by start
	// path keeps the certificate last countersigned (AnchorFile in the
	// data directory; "" = nowhere), so that a restarted bootstrap goes on
	// from it instead of waiting for a live majority to vouch for one.
	path string
	// seen remembers the volunteers seen live for replica.WitnessWindow:
	// the rules that want a majority of the live volunteers count them.
	seen *replica.Witnesses

	mu  sync.Mutex
	enc []byte // the latest anchor, encoded; nil while there is none
}

const (
	anchorInterval = 10 * time.Second
	anchorAsked    = 3                // volunteers asked per poll, latest round first
	certTimeout    = 10 * time.Second // one request for a chain
)

// AnchorFile, in the bootstrap's data directory, is the round certificate
// it last countersigned.
const AnchorFile = "anchor.cert"

// newAnchors returns the anchors of run: its book at the certificate saved
// at path, when there is one that verifies for run, else at the run's start
// (a certificate without a group: the bootstrap holds no state).
func newAnchors(run, path string, log *slog.Logger) *anchors {
	start := &replica.Certificate{Run: run}
	if c, err := loadAnchorCert(run, path); err == nil {
		start = c
		log.Info("resuming the chain of round certificates at the one last countersigned", "round", c.Round, "path", path)
	} else if !errors.Is(err, os.ErrNotExist) {
		log.Warn("the saved round certificate is not usable; waiting for the volunteers' chain", "path", path, "err", err)
	}
	a := &anchors{book: replica.NewBook(run, verifier{}, start), log: log, path: path, seen: replica.NewWitnesses(replica.WitnessWindow)}
	a.book.Anchorless = func(c *replica.Certificate) error { return replica.VouchedBy(a.recent(), c) }
	return a
}

// loadAnchorCert reads and verifies the certificate saved at path.
func loadAnchorCert(run, path string) (*replica.Certificate, error) {
	if path == "" {
		return nil, os.ErrNotExist
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, replica.MaxCertBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > replica.MaxCertBytes {
		return nil, fmt.Errorf("%w: more than %d bytes", replica.ErrBadCert, replica.MaxCertBytes)
	}
	c := new(replica.Certificate)
	if err := c.UnmarshalBinary(b); err != nil {
		return nil, err
	}
	if err := c.Verify(run, verifier{}); err != nil {
		return nil, err
	}
	if len(c.Group) == 0 {
		return nil, fmt.Errorf("%w: a certificate without a group", replica.ErrBadCert)
	}
	return c, nil
}

// verifier checks members' signatures against their peer IDs; the
// bootstrap's book never signs.
type verifier struct{}

func (verifier) Sign([]byte) ([]byte, error) {
	return nil, errors.New("bootstrap: the book does not sign")
}

func (verifier) Verify(id transport.PeerID, msg, sig []byte) bool {
	return p2p.VerifyPeer(string(id), msg, sig)
}

// start serves the latest anchor on node and polls the volunteers until
// ctx ends.
func (a *anchors) start(ctx context.Context, node *p2p.Node) error {
	a.node = node
	if t := a.book.Trusted(); len(t.Group) > 0 {
		a.countersign(t) // resumed: newcomers get it at once
	}
	if err := node.Handle(p2p.ProtoAnchor, p2p.MessageFrameConfig(replica.MaxAnchorBytes), func(_ context.Context, st *p2p.Stream) error {
		a.mu.Lock()
		enc := a.enc
		a.mu.Unlock()
		return st.WriteFrame(1, enc)
	}); err != nil {
		return err
	}
	go func() {
		t := time.NewTicker(anchorInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				a.poll(ctx)
			}
		}
	}()
	return nil
}

// certified is the state hash of round's certificate, if the bootstrap
// trusts one (status.StoreConfig.Certified).
func (a *anchors) certified(round uint64) (uint64, bool) {
	c, ok := a.book.At(round)
	if !ok || len(c.Group) == 0 {
		return 0, false
	}
	return c.Hash, true
}

// volunteers are the volunteers this bootstrap sees live.
func (a *anchors) volunteers() []transport.PeerID {
	var out []transport.PeerID
	for _, m := range a.node.Members() {
		if m.Meta.Role == p2p.RoleVolunteer {
			out = append(out, transport.PeerID(m.ID.String()))
		}
	}
	return out
}

// recent are the volunteers seen live now or within the witness window.
func (a *anchors) recent() []transport.PeerID {
	return a.seen.Observe(time.Now(), a.volunteers())
}

// poll asks up to anchorAsked volunteers announcing a later round than the
// bootstrap trusts (members of its group first, then the latest) for their
// chain after it, until one
// extends it, and countersigns the certificate it leads to. A chain that
// does not verify or extend the bootstrap's is refused and its server
// named. From the start (no group yet) only the latest certificate is
// asked for.
func (a *anchors) poll(ctx context.Context) {
	a.recent() // remember who is live now
	t := a.book.Trusted()
	var ahead []p2p.Member
	for _, m := range a.node.Members() {
		if m.Meta.Role == p2p.RoleVolunteer && m.Meta.Round > t.Round && m.Meta.StateHash != 0 {
			ahead = append(ahead, m)
		}
	}
	// Only a majority of t's group can extend it: its members are asked
	// first, so that sybils announcing far rounds do not take every turn.
	// Without a group yet, the members at the round most volunteers
	// announce come before those far ahead of it.
	var rounds []uint64
	for _, m := range ahead {
		rounds = append(rounds, m.Meta.Round)
	}
	usual := replica.MedianRound(rounds)
	rank := func(m p2p.Member) int {
		if _, ok := slices.BinarySearch(t.Group, transport.PeerID(m.ID.String())); ok {
			return 0
		}
		if m.Meta.Round <= usual+1 {
			return 1
		}
		return 2
	}
	slices.SortFunc(ahead, func(x, y p2p.Member) int {
		return cmp.Or(cmp.Compare(rank(x), rank(y)), cmp.Compare(y.Meta.Round, x.Meta.Round), cmp.Compare(x.ID, y.ID))
	})
	for _, m := range ahead[:min(anchorAsked, len(ahead))] {
		from := t.Round
		if len(t.Group) == 0 {
			// Only the latest certificate counts: a page that ends at it,
			// whether or not the volunteer's announced round is certified yet.
			from = max(from, m.Meta.Round-min(m.Meta.Round, replica.ChainPage))
		}
		chain, err := a.fetch(ctx, m.ID, from)
		if err != nil {
			a.log.Debug("no certificates from a volunteer ahead", "peer", m.ID, "err", err)
			continue
		}
		last, err := a.book.Adopt(chain)
		if errors.Is(err, replica.ErrBrokenChain) && len(chain) > 0 && len(t.Group) > 0 {
			// Churn and dissent left fewer than half of the trusted group
			// among a later round's signers: start again from the latest
			// certificate if half of the trusted group and a strict
			// majority of the volunteers seen live within the witness
			// window signed it (replica.Book.Rejoin).
			latest := chain[len(chain)-1]
			if rerr := a.book.Rejoin(latest, a.recent()); rerr == nil {
				a.log.Info("the chain no longer extends; re-anchored on the certificate of the volunteers seen live", "round", latest.Round)
				last, err = latest, nil
			} else {
				err = fmt.Errorf("%w (not re-anchored: %w)", err, rerr)
			}
		}
		if err != nil {
			a.log.Warn("offender: a volunteer's certificates do not extend the bootstrap's chain", "peer", m.ID, "round", m.Meta.Round, "err", err)
			continue
		}
		if last.Round > t.Round {
			a.countersign(last)
			return
		}
	}
}

// countersign signs c, trusted, and serves it from now on.
func (a *anchors) countersign(c *replica.Certificate) {
	an, err := replica.Countersign(c, a.node.Sign)
	var b []byte
	if err == nil {
		b, err = an.MarshalBinary()
	}
	if err != nil {
		a.log.Warn("could not countersign the round certificate", "round", c.Round, "err", err)
		return
	}
	a.mu.Lock()
	a.enc = b
	a.mu.Unlock()
	if a.path != "" {
		if cb, err := c.MarshalBinary(); err != nil {
			a.log.Warn("could not save the round certificate", "err", err)
		} else if err := atomicfile.WriteFile(a.path, cb, 0o644); err != nil {
			a.log.Warn("could not save the round certificate", "path", a.path, "err", err)
		}
	}
	a.log.Info("countersigned the round certificate", "round", c.Round, "state", fmt.Sprintf("%016x", c.Hash), "signers", len(c.Signers()))
}

// fetch asks id for its trusted certificates after round from
// (p2p.ProtoCerts).
func (a *anchors) fetch(ctx context.Context, id peer.ID, from uint64) ([]*replica.Certificate, error) {
	ctx, cancel := context.WithTimeout(ctx, certTimeout)
	defer cancel()
	frames, err := a.node.Ask(ctx, id, p2p.ProtoCerts, p2p.MessageFrameConfig(replica.MaxCertBytes), replica.ChainRequest(from), replica.ChainPage)
	if err != nil {
		return nil, err
	}
	return replica.DecodeChain(frames)
}
