package pipeline

import "errors"

// Sentinel errors. Every error this package returns wraps one of these with
// %w and names the microbatch, stage or node at fault; callers test with
// errors.Is. The path rules are numbered as in the package doc.
var (
	// ErrConfig reports a configuration field out of range.
	ErrConfig = errors.New("pipeline: invalid config")
	// ErrMalformed reports a path whose node and stage lists differ in length,
	// or that names a node or stage that does not exist.
	ErrMalformed = errors.New("pipeline: malformed path")
	// ErrPlacement reports a visit to a node that does not serve that stage.
	ErrPlacement = errors.New("pipeline: node does not serve the stage")
	// ErrStageZero reports a path that does not start at stage 0, or visits
	// it again (rule 1).
	ErrStageZero = errors.New("pipeline: stage 0 must come first and only first")
	// ErrRepeat reports a stage visited twice (rule 2).
	ErrRepeat = errors.New("pipeline: stage visited twice")
	// ErrSkips reports a path skipping a different number of stages than
	// the schedule's (rule 3).
	ErrSkips = errors.New("pipeline: wrong number of skipped stages")
	// ErrJump reports a jump over more than MaxJump stages (rule 4).
	ErrJump = errors.New("pipeline: jump too long")
	// ErrSwaps reports a reordering that is not at most MaxSwaps disjoint
	// swaps of neighbouring visits (rule 5).
	ErrSwaps = errors.New("pipeline: reordering beyond the allowed swaps")
	// ErrStageLoad reports a stage receiving more than n_1*mu microbatches
	// (rule 6).
	ErrStageLoad = errors.New("pipeline: stage over its load cap")
	// ErrStageUnderload reports a stage receiving fewer microbatches than
	// Rules.MinStageLoad (rule 6b, ours).
	ErrStageUnderload = errors.New("pipeline: stage under its load floor")
	// ErrNodeMemory reports a node on more than mu paths (rule 7).
	ErrNodeMemory = errors.New("pipeline: node over its activation memory")
	// ErrInfeasible reports a placement on which no schedule obeys the rules,
	// or a network on which no placement exists (too few nodes with enough
	// memory).
	ErrInfeasible = errors.New("pipeline: no feasible schedule")
	// ErrShape reports tensors of different lengths given to CheckFree.
	ErrShape = errors.New("pipeline: tensor shapes differ")
	// ErrNorm reports a gradient norm that is negative or not finite.
	ErrNorm = errors.New("pipeline: bad gradient norm")
	// ErrWeights reports stage weights with a value that is not finite.
	ErrWeights = errors.New("pipeline: non-finite stage weights")
	// ErrUnrecoverable reports a lost stage that CheckFree cannot rebuild
	// from its neighbours (stage 0, or an edge stage without CheckFree+).
	ErrUnrecoverable = errors.New("pipeline: stage cannot be rebuilt from neighbours")
)
