package node

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/replica"
	"github.com/skein-ml/skein/telemetry"
	"github.com/skein-ml/skein/transport"
)

// Hostile volunteers, for the chaos soak only (skein demo --chaos
// --hostile MODE, which passes the hidden --hostile flag to skein node
// join): each mode is one attack of issue [1/4] on an open run, played by a
// volunteer that otherwise runs the real code. VolunteerConfig.Hostile
// holds the mode (HostileMode maps the command line's names); "" is honest.
// Honest code paths never test for a mode: the hooks sit where the hostile
// volunteer sends.

// The hostile modes a volunteer plays itself (the butterfly's own, scale,
// signflip, poison, forge, collude and mute, are optimizer.ButterflyConfig's).
const (
	// HostileLoneJump trains and contributes honestly but announces each
	// round one ahead of the run with the true hash of weights of its own
	// (phi + 1), serves them, and certifies them itself: the lone jump,
	// which honest members followed within two rounds before round
	// certificates.
	HostileLoneJump = "lonejump"
	// HostileSybils: like HostileLoneJump, but every hostile volunteer
	// announces the same far round (2^62) with the same weights and signs
	// the others' certificates for it: two or more sybils agreeing.
	HostileSybils = "sybils"
	// HostileTelemetry trains honestly but lies in its reports to the
	// status page (lyingReport).
	HostileTelemetry = "telemetry"
	// HostileFakeBoot trains honestly but signs its membership metadata
	// with the bootstrap's role and serves a manifest and a stage plan of
	// its own: the self-declared bootstrap.
	HostileFakeBoot = "fakeboot"
	// HostileGhosts never joins: an outsider host that signs metadata for
	// volunteers made from keys it generates and gossips them, with
	// addresses in made-up /24s, at ever higher incarnations.
	HostileGhosts = "ghosts"
	// HostileNoLoCoJump (NoLoCo) announces a step far ahead of the run and
	// serves weights of its own choosing for it.
	HostileNoLoCoJump = "noloco-jump"
	// HostileNoLoCoScale (NoLoCo) sends its partners phi and an outer
	// gradient far from its own (phi + 1e3 per element, the gradient x1e3).
	HostileNoLoCoScale = "noloco-scale"
	// HostileNoLoCoRollback (NoLoCo) sends the run's initial weights as its
	// phi every step: in range, and it would erase the run's progress.
	HostileNoLoCoRollback = "noloco-rollback"
	// HostileNoLoCoBomb (NoLoCo) sends frames that decode far past the
	// model's size, and floods its partners with messages.
	HostileNoLoCoBomb = "noloco-bomb"
	// HostileStagedGrad (staged) sends its neighbours activations and
	// gradients of the largest finite bf16 (3.39e38), and NaN.
	HostileStagedGrad = "staged-grad"
	// HostileCheckFreeNorm (staged) serves its stage's weights for
	// CheckFree with a claimed gradient norm of 1e300, and NaN weights.
	HostileCheckFreeNorm = "checkfree-norm"
)

// HostileInfo describes a hostile mode for the command line and the demo.
type HostileInfo struct {
	Name string // the command line's name
	// Run is the run the mode needs: "" the data-parallel DiLoCo run,
	// "noloco", or "staged".
	Run string
	// MinCount is the fewest hostile volunteers the mode needs (sybils and
	// colluders act together).
	MinCount int
	// Outsider: the hostile process never joins the run (ghosts).
	Outsider bool
	Usage    string
}

// The runs a hostile mode may need (HostileInfo.Run).
const (
	HostileRunNoLoCo = "noloco"
	HostileRunStaged = "staged"
)

// HostileModes lists every hostile mode, in the order --help gives them.
var HostileModes = []HostileInfo{
	{Name: "scale", MinCount: 1, Usage: "x1000 contributions"},
	{Name: "signflip", MinCount: 1, Usage: "negated contributions"},
	{Name: "nan", MinCount: 1, Usage: "values past every bound"},
	{Name: "forge", MinCount: 1, Usage: "tampered aggregates"},
	{Name: "collude", MinCount: 2, Usage: "the norm budget in the same few coordinates"},
	{Name: "mute", MinCount: 1, Usage: "joins each round's group, then sends nothing"},
	{Name: HostileLoneJump, MinCount: 1, Usage: "announces the next round with weights of its own, certified by itself"},
	{Name: HostileSybils, MinCount: 2, Usage: "announce round 2^62 together, each certifying the others"},
	{Name: HostileGhosts, MinCount: 1, Outsider: true, Usage: "an outsider gossiping volunteers made from keys it generates"},
	{Name: HostileFakeBoot, MinCount: 1, Usage: "claims the bootstrap's role, with a manifest and a stage plan of its own"},
	{Name: HostileTelemetry, MinCount: 1, Usage: "lies to the status page"},
	{Name: HostileNoLoCoJump, Run: HostileRunNoLoCo, MinCount: 1, Usage: "NoLoCo: announces a far step with weights of its own"},
	{Name: HostileNoLoCoScale, Run: HostileRunNoLoCo, MinCount: 1, Usage: "NoLoCo: phi and outer gradient far from its own"},
	{Name: HostileNoLoCoRollback, Run: HostileRunNoLoCo, MinCount: 1, Usage: "NoLoCo: the run's initial weights every step"},
	{Name: HostileNoLoCoBomb, Run: HostileRunNoLoCo, MinCount: 1, Usage: "NoLoCo: oversized frames and a flood of messages"},
	{Name: HostileStagedGrad, Run: HostileRunStaged, MinCount: 1, Usage: "staged: activations and gradients of 3.39e38 and NaN"},
	{Name: HostileCheckFreeNorm, Run: HostileRunStaged, MinCount: 1, Usage: "staged: CheckFree weights with a claimed norm of 1e300, and NaN"},
}

// Hostile returns the mode named name; false if there is none.
func Hostile(name string) (HostileInfo, bool) {
	for _, h := range HostileModes {
		if h.Name == name {
			return h, true
		}
	}
	return HostileInfo{}, false
}

// HostileNames is the modes' names, comma-separated, for errors and help.
func HostileNames() string {
	names := make([]string, len(HostileModes))
	for i, h := range HostileModes {
		names[i] = h.Name
	}
	return strings.Join(names, ", ")
}

// HostileUsage is one line per mode, for --help.
func HostileUsage() string {
	var b strings.Builder
	for i, h := range HostileModes {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(h.Name + " (" + h.Usage + ")")
	}
	return b.String()
}

// HostileMode maps a chaos test's name for a hostile behaviour to
// VolunteerConfig.Hostile; "" if unknown.
func HostileMode(name string) string {
	switch name {
	case "scale":
		return optimizer.HostileScale
	case "signflip":
		return optimizer.HostileSignFlip
	case "nan":
		return optimizer.HostilePoison
	case "forge":
		return optimizer.HostileForge
	case "collude":
		return optimizer.HostileCollude
	case "mute":
		return optimizer.HostileMute
	}
	if _, ok := Hostile(name); ok {
		return name
	}
	return ""
}

// butterflyHostile is the mode the butterfly plays itself ("" for the
// volunteer's own modes).
func butterflyHostile(mode string) string {
	if slices.Contains(optimizer.HostileModes, mode) {
		return mode
	}
	return ""
}

// loneJump is HostileLoneJump's lie: the next round, with weights of this
// member's choosing under their true hash, served and certified by itself.
func (v *Volunteer) loneJump(ctx context.Context) {
	round, phi, mom := v.dl.State()
	forged := make([]float32, len(phi))
	for i, x := range phi {
		forged[i] = x + 1
	}
	v.stateHash = v.serve(round+1, forged, mom)
	self := transport.PeerID(v.pn.ID().String())
	group := []transport.PeerID{self}
	sig, err := v.pn.Sign(replica.VoteBytes(v.pn.RunID(), round+1, v.stateHash, group))
	if err == nil {
		v.certs.forged.Store(&replica.Certificate{Run: v.pn.RunID(), Round: round + 1, Hash: v.stateHash, Group: group, Sigs: [][]byte{sig}})
	}
	v.gossipRound(round+1, v.stateHash)
}

// sybilRound is the far round HostileSybils announce.
const sybilRound = 1 << 62

// sybilJump is HostileSybils' lie: every sybil serves the same weights
// (the same for all of them, whatever their own state) as the state of
// sybilRound, announces it, and signs a certificate for it whose group is
// every member announcing it; the sybils trade their signatures over the
// vote protocol (certs.sybilVote), so the certificate each serves carries
// all of theirs: a majority of its own group, but of no group the run
// certified.
func (v *Volunteer) sybilJump(ctx context.Context) {
	phi, mom := make([]float32, v.n), make([]float32, v.n)
	for i := range phi {
		phi[i] = float32(i%13) * 0.01
	}
	hash := v.serve(sybilRound, phi, mom)
	v.stateHash = hash
	self := transport.PeerID(v.pn.ID().String())
	group := []transport.PeerID{self}
	for _, a := range announcements(v.pn) {
		if a.round == sybilRound && a.hash == hash {
			group = append(group, a.id)
		}
	}
	slices.Sort(group)
	if cert := v.certs.sybilVote(hash, group, self); cert != nil {
		v.certs.forged.Store(cert)
	}
	v.gossipRound(sybilRound, hash)
}

// sybilVotes are the signatures HostileSybils collect from each other
// for sybilRound, by sender, for the group the signature covers.
type sybilVotes struct {
	mu   sync.Mutex
	sigs map[[32]byte]map[transport.PeerID][]byte
}

// take keeps v (a vote for sybilRound from a fellow sybil).
func (s *sybilVotes) take(v *replica.Certificate, from transport.PeerID) {
	i, ok := slices.BinarySearch(v.Group, from)
	if !ok || v.Sigs[i] == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d := replica.GroupDigest(v.Group)
	if s.sigs == nil {
		s.sigs = map[[32]byte]map[transport.PeerID][]byte{}
	}
	if len(s.sigs) > 64 {
		clear(s.sigs) // a bound; the sybils vote again every round
	}
	if s.sigs[d] == nil {
		s.sigs[d] = map[transport.PeerID][]byte{}
	}
	s.sigs[d][from] = v.Sigs[i]
}

// sybilVote signs this sybil's vote for (sybilRound, hash) in group,
// sends it to the group's others, and returns the certificate with every
// signature collected for that group so far.
func (c *certs) sybilVote(hash uint64, group []transport.PeerID, self transport.PeerID) *replica.Certificate {
	run := c.pn.RunID()
	sig, err := c.pn.Sign(replica.VoteBytes(run, sybilRound, hash, group))
	if err != nil {
		return nil
	}
	i, _ := slices.BinarySearch(group, self)
	vote := &replica.Certificate{Run: run, Round: sybilRound, Hash: hash, Group: group, Sigs: make([][]byte, len(group))}
	vote.Sigs[i] = sig
	c.sybils.take(vote, self)
	if b, err := vote.MarshalBinary(); err == nil {
		for _, id := range group {
			if id != self {
				c.out.Send(c.ctx, id, b)
			}
		}
	}
	cert := &replica.Certificate{Run: run, Round: sybilRound, Hash: hash, Group: group, Sigs: make([][]byte, len(group))}
	c.sybils.mu.Lock()
	for j, id := range group {
		cert.Sigs[j] = c.sybils.sigs[replica.GroupDigest(group)][id]
	}
	c.sybils.mu.Unlock()
	return cert
}

// fakeBoot is HostileFakeBoot's whole life: a member that claims the
// bootstrap's role (in an open run anyone can) and answers what
// newcomers and volunteers ask a bootstrap for with lies: a manifest of
// another model and learning rate under the run's ID, and an anchor at a
// far round that it countersigned itself. It trains nothing; it collects
// the telemetry reports sent to it. Volunteers must take the manifest, the
// anchor, stage plans and relays only from the bootstraps they dialled
// (p2p.Node.IsSeed), never from a role a member claims.
func (v *Volunteer) fakeBoot(ctx context.Context) error {
	m := v.run
	m.Model.Preset = "small"
	m.Optimizer.OuterLR *= 100
	v.pn.Unhandle(p2p.ProtoManifest)
	if err := ServeManifest(v.pn, m); err != nil {
		return err
	}
	forged := &replica.Certificate{Run: v.pn.RunID(), Round: sybilRound, Hash: 0x5eed}
	self := transport.PeerID(v.pn.ID().String())
	forged.Group = []transport.PeerID{self}
	sig, err := v.pn.Sign(replica.VoteBytes(forged.Run, forged.Round, forged.Hash, forged.Group))
	if err != nil {
		return err
	}
	forged.Sigs = [][]byte{sig}
	a, err := replica.Countersign(forged, v.pn.Sign)
	if err != nil {
		return err
	}
	enc, err := a.MarshalBinary()
	if err != nil {
		return err
	}
	if err := v.pn.Handle(p2p.ProtoAnchor, p2p.MessageFrameConfig(replica.MaxAnchorBytes), func(_ context.Context, s *p2p.Stream) error {
		return s.WriteFrame(1, enc)
	}); err != nil {
		return err
	}
	var reports atomic.Int64
	if err := v.pn.Handle(p2p.ProtoTelemetry, p2p.MessageFrameConfig(telemetry.MaxReportSize), func(_ context.Context, s *p2p.Stream) error {
		reports.Add(1)
		_, _, err := s.ReadFrame()
		return err
	}); err != nil {
		return err
	}
	say(v.cfg.Progress, "hostile: claiming the bootstrap's role with manifest %s (the run's is %s) and an anchor at round %d", m.ShortHash(), v.run.ShortHash(), forged.Round)
	<-ctx.Done()
	say(v.cfg.Progress, "hostile: %d telemetry reports were sent to the false bootstrap", reports.Load())
	return nil
}

// ghostCount is how many ghosts HostileGhosts makes up.
const ghostCount = 40

// RunGhosts is HostileGhosts: a host that never joins the run (no
// admission, no memberlist join) connects to the bootstraps of cfg and,
// every two seconds until ctx ends, announces ghostCount volunteers made
// from keys it generated, each at a made-up address in its own /24, with
// metadata each ghost's key signed, at a rising incarnation. memberlist
// spreads them to every member; none may count them for a group, a
// majority or a cap, since none has proved itself live over a connection.
func RunGhosts(ctx context.Context, cfg VolunteerConfig) error {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ncfg := p2p.DefaultNodeConfig(cfg.RunID)
	ncfg.Timing, ncfg.Logger, ncfg.JoinAlone, ncfg.Admission = cfg.Timing, log, true, &p2p.Admission{}
	if len(cfg.Listen) > 0 {
		ncfg.ListenAddrs = cfg.Listen
	}
	host, err := p2p.NewNode(ctx, ncfg)
	if err != nil {
		return err
	}
	defer host.Close()
	var boots []peer.AddrInfo
	for _, a := range cfg.Bootstrap {
		ai, err := peer.AddrInfoFromString(a)
		if err != nil {
			return fmt.Errorf("%w: --bootstrap %q: %w", ErrConfig, a, err)
		}
		boots = append(boots, *ai)
	}
	if len(boots) == 0 {
		return fmt.Errorf("%w: the ghosts need a --bootstrap to haunt", ErrConfig)
	}
	keys := make([]crypto.PrivKey, ghostCount)
	for i := range keys {
		if keys[i], _, err = crypto.GenerateEd25519Key(rand.Reader); err != nil {
			return err
		}
	}
	meta := p2p.Meta{RunID: cfg.RunID, Role: p2p.RoleVolunteer, Stage: -1}
	say(cfg.Progress, "hostile: an outsider announcing %d ghost volunteers to %d bootstrap(s)", ghostCount, len(boots))
	sent := 0
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for inc := uint64(1); ; inc++ {
		for _, b := range boots {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := host.Host().Connect(cctx, b)
			cancel()
			if err != nil {
				log.Debug("ghosts: bootstrap not reachable", "bootstrap", b.ID, "err", err)
				continue
			}
			for i, k := range keys {
				if err := p2p.ForgeAlive(host, b.ID, k, meta, fmt.Sprintf("198.18.%d.1:4001", i), inc, uint32(inc)); err == nil {
					sent++
				}
			}
		}
		select {
		case <-ctx.Done():
			say(cfg.Progress, "hostile: sent %d forged announcements", sent)
			return nil
		case <-t.C:
		}
	}
}
