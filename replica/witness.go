package replica

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/skein-ml/skein/transport"
)

// Witnesses is one judge's memory of the volunteers it saw live: those live
// now and those seen within the window before. The rules that take a
// certificate on the word of "a majority of the volunteers seen live"
// (VouchedBy: a newcomer, a chain broken by churn, the bootstrap's first
// certificate) count against this set, not against the members live at the
// moment of asking. Otherwise churn is a weapon: two sybils among five
// volunteers were a majority of the three left live in one member's view
// while one honest volunteer was killed and another paused, and that
// member re-anchored on their round-2^62 state (the sybils soak). With the
// memory, the honest volunteers that dropped out still count as voters that
// did not sign, for a window; sybils must outnumber every volunteer the
// judge saw within it.
//
// The price: an honest volunteer that leaves for good still counts against
// a re-anchor for a window (a straggler whose chain broke because half its
// group left waits that long, at most). Bounded: at most maxWitnesses
// entries (the least recently seen go first). Safe for concurrent use; no
// clock of its own (callers pass the time).
type Witnesses struct {
	window time.Duration

	mu   sync.Mutex
	seen map[transport.PeerID]time.Time
}

// WitnessWindow is how long a volunteer seen live keeps counting.
const WitnessWindow = 2 * time.Minute

const maxWitnesses = 4096

// NewWitnesses returns an empty memory that keeps a volunteer for window
// after it was last seen.
func NewWitnesses(window time.Duration) *Witnesses {
	return &Witnesses{window: window, seen: map[transport.PeerID]time.Time{}}
}

// Observe records live, the volunteers seen live at now, and returns the
// volunteers seen within the window up to now (live among them), sorted.
func (w *Witnesses) Observe(now time.Time, live []transport.PeerID) []transport.PeerID {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range live {
		w.seen[id] = now
	}
	var out []transport.PeerID
	for id, at := range w.seen {
		if now.Sub(at) > w.window {
			delete(w.seen, id)
			continue
		}
		out = append(out, id)
	}
	slices.Sort(out)
	if len(out) > maxWitnesses {
		// Keep the most recently seen (ties: the smaller ID).
		slices.SortFunc(out, func(a, b transport.PeerID) int {
			if c := w.seen[b].Compare(w.seen[a]); c != 0 {
				return c
			}
			return cmp.Compare(a, b)
		})
		for _, id := range out[maxWitnesses:] {
			delete(w.seen, id)
		}
		out = out[:maxWitnesses]
		slices.Sort(out)
	}
	return out
}

// Rejoin re-anchors the book on c, the latest certificate of a chain that
// does not extend the trusted one (ErrBrokenChain: churn and dissent left
// fewer than half of the trusted group among a later round's signers), when
// the rule for churn holds: at least half of the trusted group signed c
// (Rejoins: sybils new to the run hold none of it) and a strict majority of
// recent (Witnesses.Observe: the volunteers the judge saw live within the
// window, itself excluded) signed it. Breakdown: hostile members that are
// half of the trusted group and a majority of every volunteer the judge saw
// within the window; the bootstrap's anchor, where one answers, is taken
// before this rule (Book.AdoptFrom).
func (b *Book) Rejoin(c *Certificate, recent []transport.PeerID) error {
	t := b.Trusted()
	if !c.Rejoins(t) {
		return fmt.Errorf("%w: %d of the %d members of round %d's group signed round %d", ErrMinority, c.signedOf(t), len(t.Group), t.Round, c.Round)
	}
	if err := VouchedBy(recent, c); err != nil {
		return err
	}
	return b.Reanchor(c)
}
