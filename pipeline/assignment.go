package pipeline

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
)

// Assignment is a staged run's plan as its bootstrap publishes it to the
// volunteers: which member serves which stage from which iteration on. A
// re-plan (a member gone, a newcomer) is a new Assignment with a higher
// Epoch and a later Start; every member runs iteration i under the
// Assignment of the highest Epoch whose Start <= i, so members switch
// plans between the same two iterations.
type Assignment struct {
	Epoch uint64 // 1 for the first plan, +1 for every re-plan
	Start uint64 // the first iteration (1-based) run under it
	// Stages is S. Peers are the assigned members in node-index order
	// (Placement's node indices), StageOf their stages, and Since the
	// epoch from which each has held its stage: a member whose Since is
	// Epoch is new to its stage and takes its weights from a survivor of
	// the stage or, when the stage has none, rebuilds it with CheckFree.
	Stages  int
	Peers   []string
	StageOf []int
	Since   []uint64
	// Paths, when set, is every iteration's schedule under this plan
	// (SchedulePaths' choice for the placement, made once by whoever
	// plans); empty, the members compute RotatingSchedule's instead.
	Paths []Path
}

// Bounds of an encoded Assignment, checked before anything is allocated.
const (
	MaxAssignmentPeers = 4096
	MaxPeerIDLen       = 128
	MaxAssignmentPaths = 1024 // the manifest's most microbatches
	// MaxAssignmentBytes is the largest encoding (the frame bound).
	MaxAssignmentBytes = assignmentHeader + MaxAssignmentPeers*(2+8+1+MaxPeerIDLen) + 2 + MaxAssignmentPaths*(1+256*3)
	assignmentHeader   = 4 + 8 + 8 + 2 + 2
)

// AssignmentFrame is the frame type of an encoded Assignment on the wire
// (p2p.ProtoStagePlan); NoAssignmentFrame answers while there is no plan.
const (
	AssignmentFrame   byte = 0x50
	NoAssignmentFrame byte = 0x51
)

// ErrBadAssignment is returned (wrapped) for an invalid or undecodable
// Assignment.
var ErrBadAssignment = errors.New("pipeline: bad assignment")

var assignmentMagic = [4]byte{'S', 'K', 'A', '1'}

// Validate checks the Assignment's shape: every stage served, peers
// distinct and bounded, Since within the epochs so far.
func (a Assignment) Validate() error {
	n := len(a.Peers)
	switch {
	case a.Epoch == 0 || a.Start == 0:
		return fmt.Errorf("%w: epoch %d, start %d: both count from 1", ErrBadAssignment, a.Epoch, a.Start)
	case a.Stages < 1 || a.Stages > 256:
		return fmt.Errorf("%w: %d stages outside [1, 256]", ErrBadAssignment, a.Stages)
	case n < a.Stages || n > MaxAssignmentPeers:
		return fmt.Errorf("%w: %d members for %d stages (at most %d)", ErrBadAssignment, n, a.Stages, MaxAssignmentPeers)
	case len(a.StageOf) != n || len(a.Since) != n:
		return fmt.Errorf("%w: %d members, %d stages, %d epochs", ErrBadAssignment, n, len(a.StageOf), len(a.Since))
	}
	seen := make(map[string]bool, n)
	served := make([]bool, a.Stages)
	for i, id := range a.Peers {
		switch {
		case id == "" || len(id) > MaxPeerIDLen:
			return fmt.Errorf("%w: member %d's ID is %d bytes", ErrBadAssignment, i, len(id))
		case seen[id]:
			return fmt.Errorf("%w: member %s listed twice", ErrBadAssignment, id)
		case a.StageOf[i] < 0 || a.StageOf[i] >= a.Stages:
			return fmt.Errorf("%w: member %s serves stage %d of %d", ErrBadAssignment, id, a.StageOf[i], a.Stages)
		case a.Since[i] == 0 || a.Since[i] > a.Epoch:
			return fmt.Errorf("%w: member %s holds its stage since epoch %d, in epoch %d", ErrBadAssignment, id, a.Since[i], a.Epoch)
		}
		seen[id], served[a.StageOf[i]] = true, true
	}
	if s := slices.Index(served, false); s >= 0 {
		return fmt.Errorf("%w: stage %d has no member", ErrBadAssignment, s)
	}
	if len(a.Paths) > MaxAssignmentPaths {
		return fmt.Errorf("%w: %d paths, at most %d", ErrBadAssignment, len(a.Paths), MaxAssignmentPaths)
	}
	pl := a.Placement()
	for m, p := range a.Paths {
		if len(p.Nodes) != len(p.Stages) || len(p.Nodes) == 0 || len(p.Nodes) > a.Stages {
			return fmt.Errorf("%w: path %d has %d nodes for %d stages", ErrBadAssignment, m, len(p.Nodes), len(p.Stages))
		}
		if err := checkVisits(p, pl); err != nil {
			return fmt.Errorf("%w: path %d: %w", ErrBadAssignment, m, err)
		}
	}
	return nil
}

// Placement is the Assignment as Placement (node v = Peers[v]).
func (a Assignment) Placement() Placement {
	return Placement{Stages: a.Stages, StageOf: slices.Clone(a.StageOf)}
}

// Index returns id's node index, or -1 when id is not assigned.
func (a Assignment) Index(id string) int { return slices.Index(a.Peers, id) }

// Members returns the node indices serving stage s, in increasing order.
func (a Assignment) Members(s int) []int { return a.Placement().Nodes(s) }

// Survivors returns the members of stage s that held it before this
// epoch: the ones a newcomer to s takes its weights from.
func (a Assignment) Survivors(s int) []int {
	var out []int
	for _, v := range a.Members(s) {
		if a.Since[v] < a.Epoch {
			out = append(out, v)
		}
	}
	return out
}

// MarshalBinary encodes a (which must be valid).
func (a Assignment) MarshalBinary() ([]byte, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, assignmentHeader+len(a.Peers)*(2+8+1+32))
	b = append(b, assignmentMagic[:]...)
	b = binary.BigEndian.AppendUint64(b, a.Epoch)
	b = binary.BigEndian.AppendUint64(b, a.Start)
	b = binary.BigEndian.AppendUint16(b, uint16(a.Stages))
	b = binary.BigEndian.AppendUint16(b, uint16(len(a.Peers)))
	for i, id := range a.Peers {
		b = binary.BigEndian.AppendUint16(b, uint16(a.StageOf[i]))
		b = binary.BigEndian.AppendUint64(b, a.Since[i])
		b = append(b, byte(len(id)))
		b = append(b, id...)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(a.Paths)))
	for _, p := range a.Paths {
		b = append(b, byte(len(p.Nodes)))
		for i, v := range p.Nodes {
			b = binary.BigEndian.AppendUint16(b, uint16(v))
			b = append(b, byte(p.Stages[i]))
		}
	}
	return b, nil
}

// ParseAssignment decodes and validates an encoded Assignment. It never
// panics and allocates only what b's length bounds.
func ParseAssignment(b []byte) (Assignment, error) {
	if len(b) < assignmentHeader || len(b) > MaxAssignmentBytes {
		return Assignment{}, fmt.Errorf("%w: %d bytes", ErrBadAssignment, len(b))
	}
	if [4]byte(b[:4]) != assignmentMagic {
		return Assignment{}, fmt.Errorf("%w: not an assignment (magic %q)", ErrBadAssignment, b[:4])
	}
	a := Assignment{Epoch: binary.BigEndian.Uint64(b[4:]), Start: binary.BigEndian.Uint64(b[12:]),
		Stages: int(binary.BigEndian.Uint16(b[20:]))}
	n := int(binary.BigEndian.Uint16(b[22:]))
	rest := b[assignmentHeader:]
	if n > MaxAssignmentPeers || n*(2+8+1) > len(rest) {
		return Assignment{}, fmt.Errorf("%w: %d members in %d bytes", ErrBadAssignment, n, len(rest))
	}
	a.Peers, a.StageOf, a.Since = make([]string, n), make([]int, n), make([]uint64, n)
	for i := range n {
		if len(rest) < 2+8+1 {
			return Assignment{}, fmt.Errorf("%w: member %d truncated", ErrBadAssignment, i)
		}
		a.StageOf[i] = int(binary.BigEndian.Uint16(rest))
		a.Since[i] = binary.BigEndian.Uint64(rest[2:])
		l := int(rest[10])
		rest = rest[11:]
		if l > len(rest) {
			return Assignment{}, fmt.Errorf("%w: member %d's ID truncated", ErrBadAssignment, i)
		}
		a.Peers[i], rest = string(rest[:l]), rest[l:]
	}
	if len(rest) < 2 {
		return Assignment{}, fmt.Errorf("%w: no path count", ErrBadAssignment)
	}
	np := int(binary.BigEndian.Uint16(rest))
	rest = rest[2:]
	if np > MaxAssignmentPaths || np*(1+3) > len(rest) {
		return Assignment{}, fmt.Errorf("%w: %d paths in %d bytes", ErrBadAssignment, np, len(rest))
	}
	if np > 0 {
		a.Paths = make([]Path, np)
	}
	for m := range np {
		if len(rest) < 1 {
			return Assignment{}, fmt.Errorf("%w: path %d truncated", ErrBadAssignment, m)
		}
		l := int(rest[0])
		rest = rest[1:]
		if l*3 > len(rest) {
			return Assignment{}, fmt.Errorf("%w: path %d truncated", ErrBadAssignment, m)
		}
		p := Path{Nodes: make([]int, l), Stages: make([]int, l)}
		for i := range l {
			p.Nodes[i], p.Stages[i] = int(binary.BigEndian.Uint16(rest[3*i:])), int(rest[3*i+2])
		}
		a.Paths[m], rest = p, rest[3*l:]
	}
	if len(rest) != 0 {
		return Assignment{}, fmt.Errorf("%w: %d trailing bytes", ErrBadAssignment, len(rest))
	}
	return a, a.Validate()
}

// PathsAt is iteration iter's schedule under a: its Paths when set, else
// rs's rotating schedule over its placement.
func (a Assignment) PathsAt(rs RotatingSchedule, iter uint64) []Path {
	if len(a.Paths) > 0 {
		out := make([]Path, len(a.Paths))
		for i, p := range a.Paths {
			out[i] = Path{Nodes: slices.Clone(p.Nodes), Stages: slices.Clone(p.Stages)}
		}
		return out
	}
	return rs.Paths(a.Placement(), iter)
}

// RotatingSchedule is the schedule every member of a staged run computes
// alike for an iteration, from the placement and the run's settings alone
// (no I/O, no negotiation): microbatch m skips stages 1+(m*Skip+j) mod
// (S-1) for j < Skip, so that the skips spread evenly over stages 1..S-1;
// the k-th visit of stage s in the iteration goes to its node
// (k + s*iter) mod n_s (n_s the stage's nodes), so that successive
// iterations rotate which replica pairs with which; with Random, to a
// seeded random permutation of the stage's nodes instead (NoLoCo's random
// routing). CheckFreePlus swaps the order of stages on odd microbatches
// (CheckFreePlus).
type RotatingSchedule struct {
	Microbatches  int
	Skip          int
	Seed          uint64
	Random        bool
	CheckFreePlus bool
}

// Paths returns iteration iter's paths over pl.
func (rs RotatingSchedule) Paths(pl Placement, iter uint64) []Path {
	S := pl.Stages
	nodes := make([][]int, S)
	for s := range S {
		nodes[s] = pl.Nodes(s)
	}
	seen := make([]int, S)
	perms := make([][]int, S)
	if rs.Random {
		rng := rand.New(rand.NewPCG(rs.Seed, iter))
		for s := range perms {
			perms[s] = rng.Perm(len(nodes[s]))
		}
	}
	paths := make([]Path, rs.Microbatches)
	for m := range paths {
		skipped := make(map[int]bool, rs.Skip)
		for j := range rs.Skip {
			skipped[1+(m*rs.Skip+j)%(S-1)] = true
		}
		var p Path
		for s := range S {
			n := len(nodes[s])
			if skipped[s] || n == 0 {
				continue
			}
			k := seen[s]
			seen[s]++
			p.Stages = append(p.Stages, s)
			if perm := perms[s]; perm != nil {
				p.Nodes = append(p.Nodes, nodes[s][perm[k%n]])
			} else {
				p.Nodes = append(p.Nodes, nodes[s][(k+s*int(iter%uint64(n)))%n])
			}
		}
		if rs.CheckFreePlus {
			p = CheckFreePlus(p, m, S)
		}
		paths[m] = p
	}
	return paths
}
