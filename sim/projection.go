package sim

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Design is an outer-step design the projection compares.
type Design string

// The designs (ALGORITHMS.md 1, 2 and 6).
const (
	// DesignRing is DiLoCo with one ring all-reduce over every member:
	// 2(M-1) steps, each as slow as the ring's slowest hop.
	DesignRing Design = "diloco-ring"
	// DesignGroups is hierarchical DiLoCo: a ring reduce-scatter inside
	// groups of G neighbours (by region), a ring all-reduce of each shard
	// across the groups, a ring all-gather inside the groups; G is chosen
	// per M to minimise the expected round.
	DesignGroups Design = "diloco-groups"
	// DesignNoLoCo is NoLoCo with random pairs: each member exchanges its
	// weights and pseudo-gradient with one partner; nobody waits for others.
	DesignNoLoCo Design = "noloco-pairs"
	// DesignButterfly is the all-to-all reduce-scatter with 2 owners per
	// part, then an all-gather from one owner of each part.
	DesignButterfly Design = "butterfly"
)

// Designs lists the designs in the order reports show them.
var Designs = []Design{DesignRing, DesignGroups, DesignNoLoCo, DesignButterfly}

// ProjectionConfig is what Project needs.
type ProjectionConfig struct {
	// Members are the swarm sizes M to project.
	Members []int
	// ChurnPerHour are the failure rates to project, in deaths per member
	// per hour (0.1: a member's mean session is 10 hours).
	ChurnPerHour []float64
	// Params is the model's parameter count.
	Params float64
	// TokensPerStep is each member's batch per inner step.
	TokensPerStep float64
	// InnerSteps is H, the inner steps between outer steps.
	InnerSteps int
	// MinUplinkMbps is the admission floor: a volunteer with a slower
	// uplink is not admitted to the synchronous collective.
	MinUplinkMbps float64
	// Network names the built-in network whose regions and latencies the
	// members are drawn in.
	Network string
	Seed    uint64
	// Codec is the collective's codec (zero: MinMax8Codec).
	Codec WireCodec
	// Overlap runs each round's exchange during the next inner phase (the
	// one-step-delayed outer step): a round then lasts as long as the
	// longer of the two.
	Overlap bool
}

// codecOf is cfg's codec, MinMax8Codec by default.
func (c ProjectionConfig) codecOf() WireCodec {
	if c.Codec.Ratio == 0 {
		return MinMax8Codec
	}
	return c.Codec
}

// MaxProjectionMembers bounds Members: the population is sampled, not
// listed, and costs O(M) memory and time per design.
const MaxProjectionMembers = 100_000

// DefaultProjectionConfig projects a 124M-parameter model (the gpt2-124m
// preset) with DiLoCo's H = 500, a batch of 8 x 1024 tokens per step, for M
// from 10 to 10,000 at churn 0, 0.1 and 1 death per member-hour.
func DefaultProjectionConfig() ProjectionConfig {
	return ProjectionConfig{
		Members:       []int{10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000},
		ChurnPerHour:  []float64{0, 0.1, 1},
		Params:        124e6,
		TokensPerStep: 8 * 1024,
		InnerSteps:    500,
		MinUplinkMbps: 10,
		Network:       "volunteers20",
		Seed:          1,
	}
}

// Validate reports the first field out of range.
func (c ProjectionConfig) Validate() error {
	if len(c.Members) == 0 || len(c.ChurnPerHour) == 0 {
		return fmt.Errorf("%w: %d member counts and %d churn rates, want at least one of each", ErrConfig, len(c.Members), len(c.ChurnPerHour))
	}
	for _, m := range c.Members {
		if m < 2 || m > MaxProjectionMembers {
			return fmt.Errorf("%w: %d members outside [2, %d]", ErrConfig, m, MaxProjectionMembers)
		}
	}
	for _, r := range c.ChurnPerHour {
		if !inRange(r, 0, 1e3) {
			return fmt.Errorf("%w: churn %v per member-hour outside [0, 1000]", ErrConfig, r)
		}
	}
	switch {
	case !inRange(c.Params, 1, 1e13):
		return fmt.Errorf("%w: %v parameters outside [1, 1e13]", ErrConfig, c.Params)
	case !inRange(c.TokensPerStep, 1, 1e9):
		return fmt.Errorf("%w: %v tokens per step outside [1, 1e9]", ErrConfig, c.TokensPerStep)
	case c.InnerSteps < 1 || c.InnerSteps > 1e7:
		return fmt.Errorf("%w: %d inner steps outside [1, 1e7]", ErrConfig, c.InnerSteps)
	case !inRange(c.MinUplinkMbps, 0, 1000):
		return fmt.Errorf("%w: admission floor %v Mbit/s outside [0, 1000]", ErrConfig, c.MinUplinkMbps)
	}
	return nil
}

// Point is one projected (design, M, churn).
type Point struct {
	Design  Design
	Members int
	Churn   float64 // deaths per member-hour
	// Collective is the outer step's communication with no failure.
	Collective float64
	// Round is the expected round (inner phase, collective, deadlines and
	// redos), +Inf when a round never completes (a failure is all but
	// certain in every attempt).
	Round float64
	// Utilisation is the inner phase over Round: the share of time members
	// compute.
	Utilisation float64
	// Group is the group size DesignGroups chose; 0 for other designs.
	Group int
}

// Projection is Project's result.
type Projection struct {
	Config ProjectionConfig
	// Inner is the inner phase: H steps at the population's median speed
	// (every member computes for that long; a faster one does more work).
	Inner float64
	// WireBytes is what one member's pseudo-gradient costs on the wire.
	WireBytes float64
	Points    []Point
	// Calibration compares the butterfly model with its measurement.
	Calibration []Calibration
}

// Calibration is the butterfly model against one measured row.
type Calibration struct {
	Members             int
	Model, Measured     float64 // seconds per round
	ModelMB, MeasuredMB float64 // MB sent per member
}

// Project computes round time and utilisation of every design for every
// (M, churn) of cfg, on a population drawn from VolunteerClasses in cfg's
// network's regions (members with an uplink under the admission floor are
// redrawn). The first M members of one population of max(Members) are the
// swarm of size M, so the curves differ by M alone.
func Project(cfg ProjectionConfig) (Projection, error) {
	if err := cfg.Validate(); err != nil {
		return Projection{}, err
	}
	base, err := Builtin(cfg.Network)
	if err != nil {
		return Projection{}, err
	}
	pop, err := drawPopulation(cfg, base, slices.Max(cfg.Members))
	if err != nil {
		return Projection{}, err
	}
	proj := Projection{
		Config:      cfg,
		Inner:       float64(cfg.InnerSteps) * stepSeconds(cfg, pop.medianSpeed),
		WireBytes:   cfg.Params * 4 / cfg.codecOf().Ratio * WireOverhead,
		Calibration: calibrate(),
	}
	for _, m := range cfg.Members {
		col := pop.first(m).collectives(proj.WireBytes, cfg.Params*4, cfg.Seed)
		for _, churn := range cfg.ChurnPerHour {
			for _, d := range Designs {
				pt := col.point(d, proj.Inner, churn/3600)
				pt.Members, pt.Churn = m, churn
				if cfg.Overlap {
					// The exchange (and its waits) hides behind the next
					// inner phase as far as it is shorter.
					pt.Round = max(proj.Inner, pt.Round-proj.Inner)
				}
				pt.Utilisation = proj.Inner / pt.Round
				proj.Points = append(proj.Points, pt)
			}
		}
	}
	return proj, nil
}

// stepSeconds scales the measured step (RefStepSeconds for RefParams and
// RefTokens on the reference thread) by parameters and tokens (compute is
// about 6 * params * tokens) and divides by the member's speed.
func stepSeconds(cfg ProjectionConfig, speed float64) float64 {
	return RefStepSeconds * (cfg.Params / RefParams) * (cfg.TokensPerStep / RefTokens) / speed
}

// member is a volunteer of the projection, lighter than a Node: a
// population of 10,000 is never a Network.
type member struct {
	region           int
	up, down, access float64 // bytes/s, bytes/s, s
}

type population struct {
	members     []member
	latency     [][]float64 // region to region, s
	goodput     float64
	medianSpeed float64
	wc          WireCodec // the collective's codec
}

func drawPopulation(cfg ProjectionConfig, base *Network, n int) (*population, error) {
	spec := base.Spec()
	smp := NewSampler(cfg.Seed, spec)
	region := make(map[string]int, len(spec.Regions))
	for i, r := range spec.Regions {
		region[r] = i
	}
	p := &population{latency: base.latency, goodput: base.goodput, members: make([]member, 0, n), wc: cfg.codecOf()}
	speeds := make([]float64, 0, n)
	for draws := 0; len(p.members) < n; draws++ {
		if draws > 100*n {
			return nil, fmt.Errorf("%w: fewer than 1%% of volunteers pass the %v Mbit/s admission floor", ErrConfig, cfg.MinUplinkMbps)
		}
		ns := smp.Node()
		if ns.UpMbps < cfg.MinUplinkMbps {
			continue
		}
		nd := ns.node()
		p.members = append(p.members, member{region: region[ns.Region], up: nd.UpBps, down: nd.DownBps, access: nd.Access})
		speeds = append(speeds, ns.Speed)
	}
	slices.Sort(speeds)
	p.medianSpeed = speeds[len(speeds)/2]
	return p, nil
}

// first returns the swarm of the first m members.
func (p *population) first(m int) *population {
	q := *p
	q.members = p.members[:m]
	return &q
}

func (p *population) lat(a, b int) float64 {
	x, y := p.members[a], p.members[b]
	return x.access + p.latency[x.region][y.region] + y.access
}

func (p *population) rate(a, b int) float64 {
	return p.goodput * min(p.members[a].up, p.members[b].down)
}

// byRegion returns the members' indices ordered by region, then index: a
// ring in this order crosses regions only where the regions change.
func (p *population) byRegion() []int {
	ord := make([]int, len(p.members))
	for i := range ord {
		ord[i] = i
	}
	slices.SortStableFunc(ord, func(a, b int) int { return cmp.Compare(p.members[a].region, p.members[b].region) })
	return ord
}

// collectives holds what one swarm's collectives take without failures,
// which does not depend on the churn rate: computed once per M.
type collectives struct {
	members   int
	ring      float64
	groups    []Point // per candidate group size: Group and Collective
	pairs     []pairing
	butterfly float64
}

// pairing is one NoLoCo member's exchange and how many partners it has.
type pairing struct {
	tc       float64
	partners int
}

func (p *population) collectives(wire, fp32 float64, seed uint64) collectives {
	ord := p.byRegion()
	c := collectives{
		members:   len(p.members),
		ring:      p.ring([][]int{ord}, wire, fp32),
		pairs:     p.noloco(wire, fp32, seed),
		butterfly: p.butterfly(wire, fp32),
	}
	// Group sizes: powers of two up to M, and M itself (one ring).
	for g := 2; ; g = min(2*g, c.members) {
		c.groups = append(c.groups, Point{Design: DesignGroups, Group: g, Collective: p.hierarchical(ord, g, wire, fp32)})
		if g == c.members {
			break
		}
	}
	return c
}

// point is design d's expected round with deaths at lambda per member-second.
func (c collectives) point(d Design, inner, lambda float64) Point {
	M := float64(c.members)
	switch d {
	case DesignRing:
		return Point{Design: d, Collective: c.ring, Round: redoRound(inner, c.ring, lambda*M)}
	case DesignGroups:
		// The group size of least expected round; where every round is
		// infinite, the shortest collective.
		var best Point
		for i, g := range c.groups {
			g.Round = redoRound(inner, g.Collective, lambda*M)
			if i == 0 || g.Round < best.Round || g.Round == best.Round && g.Collective < best.Collective {
				best = g
			}
		}
		return best
	case DesignNoLoCo:
		var sumTc, sumRound float64
		for _, pr := range c.pairs {
			sumTc += pr.tc
			sumRound += waitRound(inner, pr.tc, lambda*float64(pr.partners), DetectionSeconds(c.members))
		}
		return Point{Design: d, Collective: sumTc / M, Round: sumRound / M}
	default:
		return Point{Design: d, Collective: c.butterfly, Round: waitRound(inner, c.butterfly, lambda*M, DetectionSeconds(c.members))}
	}
}

// deadline is how long survivors wait for a member of a collective before
// giving up on it.
func deadline(expected float64) float64 {
	return min(max(DeadlineFactor*expected, MinDeadline), MaxDeadline)
}

// The churn model. Every design forms its group when the inner phase ends,
// from the members that say they are ready (optimizer's butterfly does;
// DESIGN.md's "joiners enter at the next round"): a member that died during
// the inner phase costs the others ReadyWait, not a deadline. A member that
// dies during the collective costs a deadline; what follows is the
// design's: the ring's survivors redo the collective (redoRound), the
// butterfly's go on without it (waitRound), and stop waiting for it as
// soon as the membership drops it, if that comes before the deadline.
// Deaths are a Poisson process of the given rate per second over the
// members a member depends on.

// redoRound is the expected round of a collective redone among the
// survivors after each failure: failures are geometric, each attempt
// failing with q = 1 - exp(-deaths*tc), so E[failures] = q/(1-q), each
// costing a deadline (which covers the failed attempt), the last attempt tc.
func redoRound(inner, tc, deaths float64) float64 {
	q := 1 - math.Exp(-deaths*tc)
	if q >= 1-1e-12 {
		return math.Inf(1)
	}
	return inner + readyCost(inner, deaths) + tc + deadline(tc)*q/(1-q)
}

// waitRound is the expected round of a collective that survives a death
// by going on without the dead member (the butterfly: a second owner holds
// every part; NoLoCo: a member goes on alone). The survivors wait for the
// dead member until its deadline or until the membership drops it, detect
// seconds after the death, whichever comes first
// (optimizer.TestButterflyDriverDeathCostsDetection): charged in full
// beyond the collective's end, an upper bound, since a death late in the
// collective costs less.
func waitRound(inner, tc, deaths, detect float64) float64 {
	return inner + readyCost(inner, deaths) + tc + min(deadline(tc)-tc, detect)*(1-math.Exp(-deaths*tc))
}

// readyCost is the expected wait for members that died in the inner phase.
func readyCost(inner, deaths float64) float64 {
	return ReadyWait * (1 - math.Exp(-deaths*inner))
}

// codec is the time to encode n fp32 bytes and to decode as many.
func (p *population) codec(n float64) float64 { return n/p.wc.EncodeBps + n/p.wc.DecodeBps }

// ring is a pipelined ring all-reduce run by every ring of rings at once
// (each ring holding one shard of wire/fp32 bytes): 2(n-1) steps of a
// 1/n chunk, every step as slow as the slowest hop of any ring, plus the
// re-encoding at every hop (ALGORITHMS.md 1, int8 in a ring).
func (p *population) ring(rings [][]int, wire, fp32 float64) float64 {
	return p.ringSteps(rings, wire, fp32, true) + p.ringSteps(rings, wire, fp32, false)
}

// ringSteps is one half of a ring all-reduce: the reduce-scatter (or the
// all-gather), n-1 steps. The all-gather forwards bytes unchanged: no codec.
func (p *population) ringSteps(rings [][]int, wire, fp32 float64, reduce bool) float64 {
	var steps, step float64
	for _, r := range rings {
		n := len(r)
		if n < 2 {
			continue
		}
		steps = max(steps, float64(n-1))
		chunk := wire / float64(n)
		hop := 0.0
		for i, a := range r {
			b := r[(i+1)%n]
			hop = max(hop, p.lat(a, b)+chunk/p.rate(a, b))
		}
		if reduce {
			hop += p.codec(fp32 / float64(n))
		}
		step = max(step, hop)
	}
	return steps * step
}

// hierarchical is the collective of groups of g consecutive members of ord:
// reduce-scatter inside each group (shards of wire/g), all-reduce of shard
// j across the groups among their j-th members, all-gather inside each
// group. A group smaller than g (the last) lends its members round-robin to
// the shards it has no member for.
func (p *population) hierarchical(ord []int, g int, wire, fp32 float64) float64 {
	var groups [][]int
	for i := 0; i < len(ord); i += g {
		groups = append(groups, ord[i:min(i+g, len(ord))])
	}
	inside := p.ringSteps(groups, wire, fp32, true) + p.ringSteps(groups, wire, fp32, false)
	if len(groups) == 1 {
		return inside
	}
	shards := make([][]int, g)
	for j := range shards {
		for _, grp := range groups {
			shards[j] = append(shards[j], grp[j%len(grp)])
		}
	}
	return inside + p.ring(shards, wire/float64(g), fp32/float64(g))
}

// noloco pairs the members by a permutation seeded by the round (NoLoCo's
// pi = permutation(M, seed)), an odd one out joining the last pair. Each
// member sends its weights and pseudo-gradient (2 x wire) to its partner;
// a member's exchange ends when both directions have. A member whose
// partner dies waits one deadline and goes on alone; the round is the
// members' mean.
func (p *population) noloco(wire, fp32 float64, seed uint64) []pairing {
	M := len(p.members)
	perm := rand.New(rand.NewPCG(seed, uint64(M))).Perm(M)
	partner := make([][]int, M)
	for k := 0; k+1 < M; k += 2 {
		a, b := perm[k], perm[k+1]
		partner[a], partner[b] = []int{b}, []int{a}
	}
	if M%2 == 1 {
		odd, a, b := perm[M-1], perm[M-3], perm[M-2]
		partner[odd] = []int{a, b}
		partner[a] = append(partner[a], odd)
		partner[b] = append(partner[b], odd)
	}
	send := func(a, b int) float64 { return p.lat(a, b) + 2*wire/p.rate(a, b) }
	out := make([]pairing, M)
	for a := range M {
		tc := 0.0
		for _, b := range partner[a] {
			tc = max(tc, send(a, b), send(b, a))
		}
		out[a] = pairing{tc: tc + p.codec(2*fp32), partners: len(partner[a])} // encode weights and delta, decode the partner's
	}
	return out
}

// butterfly is the all-to-all collective: five latency steps (ready, group,
// scatter, cross-check, gather: the "fixed handful" of BENCHMARKS.md) at
// the swarm's longest one-way latency; a scatter in which every member
// sends 2(M-1)/M of its contribution (two owners per part) and receives as
// much for its two parts; a gather in which one owner of each part sends it
// to the M-1 others; each at the pace of the slowest member's uplink or
// downlink. Codec: encode once, decode the parts received and the result.
func (p *population) butterfly(wire, fp32 float64) float64 {
	up := make([]float64, len(p.members))
	down := make([]float64, len(p.members))
	for i, m := range p.members {
		up[i], down[i] = p.goodput*m.up, p.goodput*m.down
	}
	return butterflyTime(up, down, p.maxLatency(), wire, fp32, p.wc)
}

// ButterflySeconds is the model of one butterfly all-reduce (as in the
// projection) among members with the given goodput up- and downlinks in
// bytes/s, the longest one-way latency between two of them, what a message
// takes beyond serialization and latency (Link.Pace), wire bytes of each
// member's encoded contribution and fp32 bytes of it unencoded (the
// codec's cost, at the minmax8 codec's measured speed). Each of the five
// exchanges on its critical path (ready, group, scatter, cross-check,
// gather) pays the latency and the pace.
func ButterflySeconds(up, down []float64, latency, pace, wire, fp32 float64) float64 {
	if len(up) < 2 || len(up) != len(down) {
		return 0
	}
	return butterflyTime(up, down, latency+pace, wire, fp32, MinMax8Codec)
}

func butterflyTime(up, down []float64, lat, wire, fp32 float64, wc WireCodec) float64 {
	M := float64(len(up))
	share := (M - 1) / M
	var scatter, gather float64
	for i := range up {
		scatter = max(scatter, 2*share*wire/up[i], 2*share*wire/down[i])
		gather = max(gather, share*wire/up[i], share*wire/down[i])
	}
	return 5*lat + scatter + gather + fp32/wc.EncodeBps + (2*share+1)*fp32/wc.DecodeBps
}

// maxLatency is the longest one-way latency between two members: over the
// region pairs present, the region latency plus the largest access
// latencies at both ends.
func (p *population) maxLatency() float64 {
	access := make([]float64, len(p.latency))
	present := make([]bool, len(p.latency))
	for _, m := range p.members {
		access[m.region] = max(access[m.region], m.access)
		present[m.region] = true
	}
	var worst float64
	for a := range access {
		for b := range access {
			if present[a] && present[b] {
				worst = max(worst, access[a]+p.latency[a][b]+access[b])
			}
		}
	}
	return worst
}

// calibrate runs the butterfly model on the setup of ButterflyMeasured:
// 1 MB per member (1M parameters, 8-bit), 50 Mbit/s uplinks emulated
// exactly (goodput 1, downlinks unlimited), 30 ms one way.
func calibrate() []Calibration {
	var out []Calibration
	for _, row := range ButterflyMeasured {
		up := make([]float64, row.Members)
		down := make([]float64, row.Members)
		for i := range up {
			up[i], down[i] = 50e6/8, math.Inf(1)
		}
		wire := 1e6 * WireOverhead
		out = append(out, Calibration{
			Members:    row.Members,
			Model:      butterflyTime(up, down, 0.030, wire, 4e6, MinMax8Codec),
			Measured:   row.Seconds,
			ModelMB:    3 * float64(row.Members-1) / float64(row.Members) * wire / 1e6,
			MeasuredMB: row.MBSentMember,
		})
	}
	return out
}
