package node

import (
	"strings"

	"github.com/skein-ml/skein/optimizer"
)

// Hostile volunteers, for the chaos soak only (skein demo --chaos
// --hostile MODE, which passes the hidden --hostile flag to skein node
// join): each mode is one attack of issue [1/4] on an open run, played by a
// volunteer that otherwise runs the real code. VolunteerConfig.Hostile
// holds the mode (HostileMode maps the command line's names); "" is honest.
// Honest code paths never test for a mode: the hooks sit where the hostile
// volunteer sends.

// The hostile modes a volunteer plays itself (the butterfly's own, scale,
// signflip, poison, forge and collude, are optimizer.ButterflyConfig's).
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
	}
	if _, ok := Hostile(name); ok {
		return name
	}
	return ""
}

// butterflyHostile is the mode the butterfly plays itself ("" for the
// volunteer's own modes).
func butterflyHostile(mode string) string {
	for _, m := range optimizer.HostileModes {
		if m == mode {
			return mode
		}
	}
	return ""
}
