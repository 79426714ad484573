package experiment

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
)

// ConvergenceConfig configures `skein bench convergence`: the same model,
// data and token budget trained several ways, validated on one held-out set.
type ConvergenceConfig struct {
	Preset      string
	Workers     int // M
	Batch       int // per worker
	SeqLen      int
	Steps       int // inner steps per worker (and steps of the baselines)
	WarmSteps   int // synchronous steps that make the warm-start checkpoint; 0 skips the warm arms
	EvalBatches int
	Seed        uint64
	LR          float64
	Arms        []string // subset of ArmNames(); empty means all
	// Overrides of the DiLoCo arms' outer rule, for tuning: OuterLR (0:
	// the arm's own), OuterMomentum (nil: the arm's own), and the residual
	// decay of the sparse, support and subspace arms (0: the arm's own).
	OuterLR       float64
	OuterMomentum *float64
	ResidualDecay float32
	Out           string // directory for results.json, results.md and curves.svg
	Logger        *slog.Logger
	Progress      io.Writer
}

// Arm is one way of training in the convergence benchmark.
type Arm struct {
	Name        string
	Description string
	Warm        bool
	configure   func(c *SwarmConfig)
}

func int8Codec() compression.Config {
	c := compression.DefaultConfig()
	c.Codec, c.ZstdLevel = compression.MinMax8, 0
	return c
}

func codecConfig(k compression.Codec) compression.Config {
	c := compression.DefaultConfig()
	c.Codec, c.ZstdLevel = k, 0
	return c
}

// Arms lists the benchmark's arms in report order.
func Arms() []Arm {
	return []Arm{
		{Name: "sync", Description: "synchronous baseline: one model, batch M*B", configure: func(c *SwarmConfig) { c.Algorithm = Sync }},
		{Name: "single", Description: "one worker alone, batch B", configure: func(c *SwarmConfig) { c.Algorithm = Single }},
		{Name: "diloco-h50-int8", Description: "DiLoCo H=50, int8 (min-max), butterfly mean", configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps = DiLoCo, 50
		}},
		{Name: "diloco-h25-int8", Description: "DiLoCo H=25, int8 (min-max), butterfly mean", configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps = DiLoCo, 25
		}},
		{Name: "diloco-h50-delayed", Description: "DiLoCo H=50, int8, butterfly default robust rule, each exchange overlapped with the next inner phase (one-step delayed)", configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps, c.Robust, c.Delayed = DiLoCo, 50, optimizer.DefaultRobust(), true
		}},
		{Name: "diloco-h50-fp32", Description: "DiLoCo H=50, fp32, butterfly mean", configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps, c.Codec = DiLoCo, 50, codecConfig(compression.FP32)
		}},
		{Name: "diloco-h50-int4ef", Description: "DiLoCo H=50, int4 + error feedback, butterfly mean", configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps, c.Codec = DiLoCo, 50, codecConfig(compression.Int4)
			fb := codecConfig(compression.Int4)
			c.DiLoCo.Feedback = &fb
		}},
		{Name: "noloco-h50", Description: "NoLoCo H=50, groups of 2, bf16 weights + int8 outer gradients", configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps = NoLoCo, 50
		}},
		// Robust aggregation (issue 9): the cost of safety with no attacker,
		// and one hostile worker (the last) scaling its pseudo-gradient.
		{Name: "diloco-h50-mean", Description: "DiLoCo H=50, int8, butterfly plain mean (trim 0)", configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps = DiLoCo, 50
		}},
		{Name: "diloco-h50-trim1", Description: "DiLoCo H=50, int8, butterfly trimmed mean (trim 1)", configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps, c.Robust = DiLoCo, 50, optimizer.RobustConfig{Trim: 1}
		}},
		{Name: "diloco-h50-robust", Description: "DiLoCo H=50, int8, butterfly default robust rule (trim 1, norms clipped at 4x the median)", configure: robustArm},
		// The sparse codec (issue [3/4]): SparseLoCo's density (64 of every
		// 4096) and 2-bit values with error feedback, all-gathered and
		// averaged (not robust yet).
		{Name: "diloco-h50-sparse", Description: "DiLoCo H=50, sparse top-64/4096 2-bit + error feedback, all-gather plain mean (not robust yet)", configure: func(c *SwarmConfig) {
			sc := compression.DefaultSparseConfig()
			c.Algorithm, c.InnerSteps, c.Sparse = DiLoCo, 50, &sc
		}},
		{Name: "diloco-h50-sparse-ef", Description: "DiLoCo H=50, sparse top-64/4096 2-bit, error feedback (decay 0.95) in place of the outer momentum (outer SGD, lr 1), all-gather plain mean, SparseLoCo's outer rule", configure: func(c *SwarmConfig) {
			sc := compression.DefaultSparseConfig()
			c.Algorithm, c.InnerSteps, c.Sparse, c.SparseBeta = DiLoCo, 50, &sc, 0.95
			c.DiLoCo.OuterLR, c.DiLoCo.Momentum = 1, 0
		}},
		{Name: "diloco-h50-sparse-ef3", Description: "diloco-h50-sparse-ef with outer SGD lr 3 (the best of 1, 2, 3 and 5 measured)", configure: func(c *SwarmConfig) {
			sc := compression.DefaultSparseConfig()
			c.Algorithm, c.InnerSteps, c.Sparse, c.SparseBeta = DiLoCo, 50, &sc, 0.95
			c.DiLoCo.OuterLR, c.DiLoCo.Momentum = 3, 0
		}},
		{Name: "diloco-h50-sparse-ef3-robust", Description: "diloco-h50-sparse-ef3 with the default robust rule per coordinate over the union of the members' messages (norms clipped, trim 1; a coordinate one member alone sends is trimmed)", configure: sparseRobust(64, 3, 0)},
		{Name: "diloco-h50-sparse-ef3-robust-attack", Description: "diloco-h50-sparse-ef3-robust with one worker scaling its pseudo-gradient by 1000", configure: sparseRobust(64, 3, 1000)},
		{Name: "diloco-h50-sparse-ef3-robust-flip", Description: "diloco-h50-sparse-ef3-robust with one worker flipping the sign of its pseudo-gradient (x -4)", configure: sparseRobust(64, 3, -4)},
		{Name: "diloco-h50-sparse128-ef3-robust", Description: "diloco-h50-sparse-ef3-robust at top-128/4096", configure: sparseRobust(128, 3, 0)},
		{Name: "diloco-h50-sparse128-ef", Description: "diloco-h50-sparse-ef at twice the density: top-128/4096", configure: func(c *SwarmConfig) {
			sc := compression.DefaultSparseConfig()
			sc.K = 128
			c.Algorithm, c.InnerSteps, c.Sparse, c.SparseBeta = DiLoCo, 50, &sc, 0.95
			c.DiLoCo.OuterLR, c.DiLoCo.Momentum = 1, 0
		}},
		// The shared support (issue [3/4]): the butterfly, its robust rule and
		// minmax8 on the compacted vector of each round's support.
		{Name: "diloco-h50-support", Description: "DiLoCo H=50, shared support 64/4096 (half by momentum) + error feedback, butterfly default robust rule, minmax8", configure: func(c *SwarmConfig) {
			s := optimizer.DefaultSupport()
			c.Algorithm, c.InnerSteps, c.Robust, c.DiLoCo.Support = DiLoCo, 50, optimizer.DefaultRobust(), &s
		}},
		{Name: "diloco-h50-support-random", Description: "DiLoCo H=50, a shared support 64/4096 drawn by a keyed hash of the round alone + error feedback (decay 0.95), outer SGD lr 3, butterfly default robust rule, minmax8", configure: func(c *SwarmConfig) {
			s := optimizer.SupportConfig{Chunk: 4096, K: 64, Decay: 0.95}
			c.Algorithm, c.InnerSteps, c.Robust, c.DiLoCo.Support = DiLoCo, 50, optimizer.DefaultRobust(), &s
			c.DiLoCo.OuterLR, c.DiLoCo.Momentum = 3, 0
		}},
		// Denser supports with fewer bits a value, at about the same bytes
		// (session 7): the density/precision trade at 2000x.
		{Name: "diloco-h50-random2048-int4", Description: "DiLoCo H=50, a shared support of 2048 of every 4096 by a keyed hash of the round + error feedback (decay 1), int4 through the butterfly (default robust rule), outer Nesterov 0.7/0.9", configure: randomSupport(2048, compression.Int4)},
		{Name: "diloco-h50-random256", Description: "diloco-h50-random2048-int4 at 256 of every 4096, minmax8", configure: randomSupport(256, compression.MinMax8)},
		{Name: "diloco-h50-nominated256", Description: "diloco-h50-nominated at 256/4096 (64 nominations a member), outer SGD lr 2", configure: nominatedCodec(256, 64, 2, compression.MinMax8)},
		{Name: "diloco-h50-nominated256-int4", Description: "diloco-h50-nominated256 with int4 values through the butterfly", configure: nominatedCodec(256, 64, 2, compression.Int4)},
		{Name: "diloco-h50-nominated512-int4", Description: "diloco-h50-nominated at 512/4096 (128 nominations a member), int4 values, outer SGD lr 2", configure: nominatedCodec(512, 128, 2, compression.Int4)},
		{Name: "diloco-h50-nomblock16-512-int4", Description: "diloco-h50-nominated512-int4 with nominations by blocks of 16 coordinates (8 blocks a member and chunk)", configure: blockNominated(512, 128, 16, 2, compression.Int4)},
		{Name: "diloco-h50-random512-int4", Description: "DiLoCo H=50, a shared support of 512 of every 4096 by a keyed hash of the round + error feedback (decay 0.95), int4 through the butterfly (default robust rule), outer SGD lr 2", configure: randomSGD(512, compression.Int4)},
		{Name: "diloco-h50-random1024-int4", Description: "diloco-h50-random512-int4 at 1024 of every 4096", configure: randomSGD(1024, compression.Int4)},
		{Name: "diloco-h50-random1024-int2", Description: "diloco-h50-random512-int4 at 1024 of every 4096 with int2 values (about the same bytes)", configure: randomSGD(1024, compression.Int2)},
		{Name: "diloco-h50-random512-int4-fr", Description: "diloco-h50-random512-int4 whose residual also keeps what the butterfly's rounding lost (SupportConfig.FeedRounding)", configure: feedRounding(randomSGD(512, compression.Int4))},
		{Name: "diloco-h50-random1024-int2-fr", Description: "diloco-h50-random1024-int2 with FeedRounding", configure: feedRounding(randomSGD(1024, compression.Int2))},
		{Name: "diloco-h50-nominated1024-int2-fr", Description: "diloco-h50-nominated1024-int2 with FeedRounding", configure: feedRounding(nominatedCodec(1024, 256, 2, compression.Int2))},
		{Name: "diloco-h50-cycle1024-int2", Description: "DiLoCo H=50, a cycling shared support of 1024 of every 4096 (each coordinate every 4 rounds) + error feedback (decay 0.95), int2 through the butterfly (default robust rule), outer SGD lr 2", configure: cycle(1024, compression.Int2, false)},
		{Name: "diloco-h50-cycle1024-int2-fr", Description: "diloco-h50-cycle1024-int2 with FeedRounding", configure: cycle(1024, compression.Int2, true)},
		{Name: "diloco-h50-random2048-sign", Description: "DiLoCo H=50, a shared support of 2048 of every 4096 by a keyed hash of the round + error feedback (decay 0.95) keeping the rounding too, 1-bit signs through the butterfly (default robust rule), outer SGD lr 2", configure: feedRounding(randomSGD(2048, compression.Sign))},
		{Name: "diloco-h50-random1792-sign", Description: "diloco-h50-random2048-sign at 1792 of every 4096 (2000x or more)", configure: feedRounding(randomSGD(1792, compression.Sign))},
		{Name: "diloco-h50-random2048-sign-b4096", Description: "diloco-h50-random2048-sign with a scale per 4096 values instead of 256", configure: feedRounding(blocked(randomSGD(2048, compression.Sign), 4096))},
		{Name: "diloco-h50-random2048-sign-b1024", Description: "diloco-h50-random2048-sign with a scale per 1024 values", configure: feedRounding(blocked(randomSGD(2048, compression.Sign), 1024))},
		{Name: "diloco-h50-random1920-sign-b512", Description: "diloco-h50-random2048-sign at 1920 of every 4096 with a scale per 512 values", configure: feedRounding(blocked(randomSGD(1920, compression.Sign), 512))},
		{Name: "diloco-h50-sign2048", Description: "the volunteers' support (skein demo --outer support): 2048 of every 4096 by a keyed hash of the round, 1-bit signs with a scale per 1024, error feedback (decay 0.5) keeping the rounding, butterfly default robust rule, outer SGD lr 3", configure: signK(2048)},
		{Name: "diloco-h50-sign1792", Description: "diloco-h50-sign2048 at 1792 of every 4096", configure: signK(1792)},
		{Name: "diloco-h50-sign1536", Description: "diloco-h50-sign2048 at 1536 of every 4096 (skein demo --outer support)", configure: signK(1536)},
		{Name: "diloco-h50-sign1536-agg-int2", Description: "diloco-h50-sign1536 with the butterfly's aggregates in int2 instead of signs", configure: aggCodec(signK(1536), compression.Int2)},
		{Name: "diloco-h50-sign1536-agg-int4", Description: "diloco-h50-sign1536 with the butterfly's aggregates in int4 instead of signs", configure: aggCodec(signK(1536), compression.Int4)},
		{Name: "diloco-h50-sign1536-attack", Description: "diloco-h50-sign1536 with one worker scaling its pseudo-gradient by 1000", configure: withAttack(signK(1536), 1000)},
		{Name: "diloco-h50-sign1536-flip", Description: "diloco-h50-sign1536 with one worker flipping the sign of its pseudo-gradient (x -4)", configure: withAttack(signK(1536), -4)},
		{Name: "diloco-h50-sign1536-b256", Description: "diloco-h50-sign1536 with a sign scale per 256 values instead of 1024", configure: blocked(signK(1536), 256)},
		{Name: "diloco-h50-sign1536-b256-attack", Description: "diloco-h50-sign1536-b256 with one worker scaling its pseudo-gradient by 1000", configure: withAttack(blocked(signK(1536), 256), 1000)},
		{Name: "diloco-h50-sign1536-b256-flip", Description: "diloco-h50-sign1536-b256 with one worker flipping the sign of its pseudo-gradient (x -4)", configure: withAttack(blocked(signK(1536), 256), -4)},
		{Name: "diloco-h50-sign1536-b128", Description: "diloco-h50-sign1536 with a sign scale per 128 values instead of 1024", configure: blocked(signK(1536), 128)},
		// The support in a rotated basis with the outer momentum and no
		// residual (session 14): signs of rotated values lose no more than
		// 8-bit values, and the momentum, not error feedback, carries a
		// coordinate between the rounds that send it.
		{Name: "diloco-h50-rot1536", Description: "DiLoCo H=50, a shared support of 1536 of every 4096 rotated coordinates (a fixed randomized Hadamard basis per chunk) by a keyed hash of the round, 1-bit signs with a scale per 256, no residual, butterfly default robust rule, outer Nesterov 0.9 at lr 1.87 (0.7 x 4096/1536)", configure: rotK(1536, 256)},
		{Name: "diloco-h50-rot1536-b1024", Description: "diloco-h50-rot1536 with a sign scale per 1024 values", configure: rotK(1536, 1024)},
		{Name: "diloco-h50-rot1792-b1024", Description: "DiLoCo H=50, diloco-h50-rot1536's rule on 1792 of every 4096 rotated coordinates, a sign scale per 1024 values, outer Nesterov 0.9 at lr 1.6 (0.7 x 4096/1792)", configure: rotKLR(1792, 1024, 1.6)},
		{Name: "diloco-h50-rot1792-b1024-attack", Description: "diloco-h50-rot1792-b1024 with one worker scaling its pseudo-gradient by 1000", configure: withAttack(rotKLR(1792, 1024, 1.6), 1000)},
		{Name: "diloco-h50-rot1792-b1024-flip", Description: "diloco-h50-rot1792-b1024 with one worker flipping the sign of its pseudo-gradient (x -4)", configure: withAttack(rotKLR(1792, 1024, 1.6), -4)},
		{Name: "diloco-h50-rot1536-tiled", Description: "diloco-h50-rot1536 with one hash draw a round, tiled over every chunk (SupportConfig.Tiled)", configure: tiled(rotK(1536, 256))},
		{Name: "diloco-h50-rot1792-b1024-tiled", Description: "diloco-h50-rot1792-b1024 with one hash draw a round, tiled over every chunk (SupportConfig.Tiled)", configure: tiled(rotKLR(1792, 1024, 1.6))},
		{Name: "diloco-h50-rot1792-b1024-tiled-attack", Description: "diloco-h50-rot1792-b1024-tiled with one worker scaling its pseudo-gradient by 1000", configure: withAttack(tiled(rotKLR(1792, 1024, 1.6)), 1000)},
		{Name: "diloco-h50-rot1792-b1024-tiled-overlap5", Description: "diloco-h50-rot1792-b1024-tiled with each exchange overlapped with the next phase's first 5 inner steps, then landed", configure: delayed(tiled(rotKLR(1792, 1024, 1.6)), 5)},
		{Name: "diloco-h50-rot1792-b1024-tiled-overlap15", Description: "diloco-h50-rot1792-b1024-tiled with each exchange overlapped with the next phase's first 15 inner steps, then landed", configure: delayed(tiled(rotKLR(1792, 1024, 1.6)), 15)},
		{Name: "diloco-h50-rot1792-b1024-tiled-overlap30", Description: "diloco-h50-rot1792-b1024-tiled with each exchange overlapped with the next phase's first 30 inner steps, then landed (where the projection's 124M and 1B rounds land: sim.Project)", configure: delayed(tiled(rotKLR(1792, 1024, 1.6)), 30)},
		{Name: "diloco-h50-rot1792-b1024-tiled-delayed", Description: "diloco-h50-rot1792-b1024-tiled with each exchange overlapped with the whole next inner phase (one-step delayed)", configure: delayed(tiled(rotKLR(1792, 1024, 1.6)), 0)},
		{Name: "diloco-h50-rot1792-b1024-tiled-flip", Description: "diloco-h50-rot1792-b1024-tiled with one worker flipping the sign of its pseudo-gradient (x -4)", configure: withAttack(tiled(rotKLR(1792, 1024, 1.6)), -4)},
		{Name: "diloco-h50-rot1536-attack", Description: "diloco-h50-rot1536 with one worker scaling its pseudo-gradient by 1000", configure: withAttack(rotK(1536, 256), 1000)},
		{Name: "diloco-h50-rot1536-flip", Description: "diloco-h50-rot1536 with one worker flipping the sign of its pseudo-gradient (x -4)", configure: withAttack(rotK(1536, 256), -4)},
		{Name: "diloco-h50-sign2048-delayed", Description: "diloco-h50-sign2048 with each exchange overlapped with the next inner phase (one-step delayed)", configure: func(c *SwarmConfig) {
			signK(2048)(c)
			c.Delayed = true
		}},
		{Name: "diloco-h50-robust-overlap2", Description: "diloco-h50-robust with each exchange overlapped with the next phase's first 2 inner steps, then landed (optimizer.DiLoCo.Land)", configure: delayed(robustArm, 2)},
		{Name: "diloco-h50-robust-overlap5", Description: "diloco-h50-robust with each exchange overlapped with the next phase's first 5 inner steps, then landed", configure: delayed(robustArm, 5)},
		{Name: "diloco-h50-sign1536-delayed", Description: "diloco-h50-sign1536 with each exchange overlapped with the whole next inner phase (one-step delayed)", configure: delayed(signK(1536), 0)},
		{Name: "diloco-h50-sign1536-overlap1", Description: "diloco-h50-sign1536 with each exchange overlapped with the next phase's first inner step, then landed (optimizer.DiLoCo.Land)", configure: delayed(signK(1536), 1)},
		{Name: "diloco-h50-sign1536-overlap2", Description: "diloco-h50-sign1536 with each exchange overlapped with the next phase's first 2 inner steps, then landed (optimizer.DiLoCo.Land)", configure: delayed(signK(1536), 2)},
		{Name: "diloco-h50-sign1536-overlap5", Description: "diloco-h50-sign1536 with each exchange overlapped with the next phase's first 5 inner steps, then landed", configure: delayed(signK(1536), 5)},
		{Name: "diloco-h50-sign1536-overlap10", Description: "diloco-h50-sign1536 with each exchange overlapped with the next phase's first 10 inner steps, then landed", configure: delayed(signK(1536), 10)},
		{Name: "diloco-h50-sign2048-attack", Description: "diloco-h50-sign2048 with one worker scaling its pseudo-gradient by 1000", configure: withAttack(signK(2048), 1000)},
		{Name: "diloco-h50-sign2048-flip", Description: "diloco-h50-sign2048 with one worker flipping the sign of its pseudo-gradient (x -4)", configure: withAttack(signK(2048), -4)},
		{Name: "diloco-h50-random1792-sign-attack", Description: "diloco-h50-random1792-sign with one worker scaling its pseudo-gradient by 1000", configure: withAttack(feedRounding(randomSGD(1792, compression.Sign)), 1000)},
		{Name: "diloco-h50-random1792-sign-flip", Description: "diloco-h50-random1792-sign with one worker flipping the sign of its pseudo-gradient (x -4)", configure: withAttack(feedRounding(randomSGD(1792, compression.Sign)), -4)},
		{Name: "diloco-h50-cycle2048-sign", Description: "diloco-h50-random2048-sign with a cycling support (each coordinate every 2 rounds)", configure: cycle(2048, compression.Sign, true)},
		{Name: "diloco-h50-nominated2048-sign", Description: "diloco-h50-nominated at 2048/4096 (512 nominations a member) with 1-bit signs and FeedRounding", configure: feedRounding(nominatedCodec(2048, 512, 2, compression.Sign))},
		{Name: "diloco-h50-nominated1024-int2", Description: "diloco-h50-nominated512-int4 at 1024 of every 4096 (256 nominations a member) with int2 values (about the same bytes)", configure: nominatedCodec(1024, 256, 2, compression.Int2)},
		{Name: "diloco-h50-nominated", Description: "DiLoCo H=50, a shared support 64/4096 of the union of each member's own top 16 (nominations exchanged for free, in process) + error feedback (decay 0.95), outer SGD lr 3, butterfly default robust rule, minmax8", configure: nominated(64, 16, optimizer.DefaultRobust(), false, 0)},
		{Name: "diloco-h50-nominated-mean", Description: "diloco-h50-nominated with the butterfly's plain mean (trim 0, no clip): what the robust rule costs", configure: nominated(64, 16, optimizer.RobustConfig{}, false, 0)},
		{Name: "diloco-h50-nominated128", Description: "diloco-h50-nominated at twice the density: 128/4096, 32 nominations a member", configure: nominated(128, 32, optimizer.DefaultRobust(), false, 0)},
		{Name: "diloco-h50-nominated-stale", Description: "diloco-h50-nominated with nominations from the residual alone (known a round ahead, so they can cross the network during the inner phase)", configure: nominated(64, 16, optimizer.DefaultRobust(), true, 0)},
		{Name: "diloco-h50-nominated-attack", Description: "diloco-h50-nominated with one worker scaling its pseudo-gradient by 1000", configure: nominated(64, 16, optimizer.DefaultRobust(), false, 1000)},
		{Name: "diloco-h50-nominated-flip", Description: "diloco-h50-nominated with one worker flipping the sign of its pseudo-gradient (x -4)", configure: nominated(64, 16, optimizer.DefaultRobust(), false, -4)},
		{Name: "diloco-h50-support-attack", Description: "diloco-h50-support with one worker scaling its pseudo-gradient by 1000", configure: func(c *SwarmConfig) {
			s := optimizer.DefaultSupport()
			c.Algorithm, c.InnerSteps, c.Robust, c.DiLoCo.Support, c.Attack = DiLoCo, 50, optimizer.DefaultRobust(), &s, 1000
		}},
		// The shared subspace (issue [3/4]): each weight matrix's
		// coordinates in a rank-r basis that follows the aggregate (PowerSGD's
		// power iteration, one side per round), the butterfly's robust rule
		// and minmax8 on the compacted vector, error feedback locally.
		{Name: "diloco-h50-subspace4", Description: "DiLoCo H=50, shared rank-4 subspace + error feedback, butterfly default robust rule, minmax8", configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps, c.Robust, c.SubspaceRank = DiLoCo, 50, optimizer.DefaultRobust(), 4
		}},
		{Name: "diloco-h50-subspace8", Description: "DiLoCo H=50, shared rank-8 subspace + error feedback, butterfly default robust rule, minmax8", configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps, c.Robust, c.SubspaceRank = DiLoCo, 50, optimizer.DefaultRobust(), 8
		}},
		{Name: "diloco-h50-subspace4-ef", Description: "diloco-h50-subspace4 with SparseLoCo's outer rule: residual decay 0.95 in place of the outer momentum, outer SGD lr 1", configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps, c.Robust, c.SubspaceRank, c.SubspaceDecay = DiLoCo, 50, optimizer.DefaultRobust(), 4, 0.95
			c.DiLoCo.OuterLR, c.DiLoCo.Momentum = 1, 0
		}},
		{Name: "diloco-h50-mean-attack", Description: "DiLoCo H=50, int8, butterfly plain mean, one worker scales its pseudo-gradient by 1000", configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps, c.Attack = DiLoCo, 50, 1000
		}},
		{Name: "diloco-h50-clip4-attack", Description: "DiLoCo H=50, int8, butterfly plain mean of norms clipped at 4x the median, one worker scales its pseudo-gradient by 1000", configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps, c.Robust, c.Attack = DiLoCo, 50, optimizer.RobustConfig{ClipFactor: 4}, 1000
		}},
		{Name: "diloco-h50-trim1-attack", Description: "DiLoCo H=50, int8, butterfly trimmed mean (trim 1), one worker scales its pseudo-gradient by 1000", configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps, c.Robust, c.Attack = DiLoCo, 50, optimizer.RobustConfig{Trim: 1}, 1000
		}},
		{Name: "diloco-h50-robust-attack", Description: "DiLoCo H=50, int8, butterfly default robust rule, one worker scales its pseudo-gradient by 1000", configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps, c.Robust, c.Attack = DiLoCo, 50, optimizer.DefaultRobust(), 1000
		}},
		{Name: "warm-sync", Description: "warm start: synchronous", Warm: true, configure: func(c *SwarmConfig) { c.Algorithm = Sync }},
		{Name: "warm-single", Description: "warm start: one worker alone", Warm: true, configure: func(c *SwarmConfig) { c.Algorithm = Single }},
		{Name: "warm-diloco-h50-robust", Description: "warm start: DiLoCo H=50, int8, butterfly default robust rule", Warm: true, configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps, c.Robust = DiLoCo, 50, optimizer.DefaultRobust()
		}},
		{Name: "warm-diloco-h50-nominated", Description: "warm start: diloco-h50-nominated", Warm: true, configure: nominated(64, 16, optimizer.DefaultRobust(), false, 0)},
		{Name: "warm-diloco-h50-sign1536", Description: "warm start: diloco-h50-sign1536", Warm: true, configure: signK(1536)},
		{Name: "warm-diloco-h50-sign1536-b256", Description: "warm start: diloco-h50-sign1536-b256", Warm: true, configure: blocked(signK(1536), 256)},
		{Name: "warm-diloco-h50-sign1536-b128", Description: "warm start: diloco-h50-sign1536-b128", Warm: true, configure: blocked(signK(1536), 128)},
		{Name: "warm-diloco-h50-rot1536", Description: "warm start: diloco-h50-rot1536", Warm: true, configure: rotK(1536, 256)},
		{Name: "warm-diloco-h50-rot1536-b1024", Description: "warm start: diloco-h50-rot1536-b1024", Warm: true, configure: rotK(1536, 1024)},
		{Name: "warm-diloco-h50-rot1792-b1024", Description: "warm start: diloco-h50-rot1792-b1024", Warm: true, configure: rotKLR(1792, 1024, 1.6)},
		{Name: "warm-diloco-h50-rot1536-tiled", Description: "warm start: diloco-h50-rot1536-tiled", Warm: true, configure: tiled(rotK(1536, 256))},
		{Name: "warm-diloco-h50-rot1792-b1024-tiled", Description: "warm start: diloco-h50-rot1792-b1024-tiled", Warm: true, configure: tiled(rotKLR(1792, 1024, 1.6))},
		{Name: "warm-diloco-h50-rot1792-b1024-tiled-overlap30", Description: "warm start: diloco-h50-rot1792-b1024-tiled-overlap30", Warm: true, configure: delayed(tiled(rotKLR(1792, 1024, 1.6)), 30)},
		{Name: "warm-diloco-h50-sign1536-agg-int2", Description: "warm start: diloco-h50-sign1536-agg-int2", Warm: true, configure: aggCodec(signK(1536), compression.Int2)},
		{Name: "warm-diloco-h50-sign1536-agg-int4", Description: "warm start: diloco-h50-sign1536-agg-int4", Warm: true, configure: aggCodec(signK(1536), compression.Int4)},
		{Name: "warm-diloco-h50-sign4096", Description: "warm start: diloco-h50-sign2048 at every coordinate (signs, not a support's worth of bytes: where the signs' limit is)", Warm: true, configure: signK(4096)},
		{Name: "warm-diloco-h50-minmax2048", Description: "warm start: diloco-h50-sign2048 with minmax8 values (where the support's limit is)", Warm: true, configure: func(c *SwarmConfig) {
			signK(2048)(c)
			c.Codec.Codec = compression.MinMax8
		}},
		{Name: "warm-diloco-h50-sign2048", Description: "warm start: diloco-h50-sign2048", Warm: true, configure: signK(2048)},
		{Name: "warm-diloco-h50-random1792-sign", Description: "warm start: diloco-h50-random1792-sign", Warm: true, configure: feedRounding(randomSGD(1792, compression.Sign))},
		{Name: "warm-diloco-h50-sparse-ef3", Description: "warm start: diloco-h50-sparse-ef3", Warm: true, configure: func(c *SwarmConfig) {
			sc := compression.DefaultSparseConfig()
			c.Algorithm, c.InnerSteps, c.Sparse, c.SparseBeta = DiLoCo, 50, &sc, 0.95
			c.DiLoCo.OuterLR, c.DiLoCo.Momentum = 3, 0
		}},
		{Name: "warm-diloco-h50-int8", Description: "warm start: DiLoCo H=50, int8, butterfly mean", Warm: true, configure: func(c *SwarmConfig) {
			c.Algorithm, c.InnerSteps = DiLoCo, 50
		}},
	}
}

// nominated configures a DiLoCo arm whose support is the union of each
// member's own top `each` of every 4096 coordinates, topped up to k by the
// round's hash (nominations exchanged in process), with error feedback
// (decay 0.95), outer SGD lr 3, the butterfly's rule robust and minmax8;
// attack as SwarmConfig.Attack.
func randomSupport(k int, codec compression.Codec) func(c *SwarmConfig) {
	return func(c *SwarmConfig) {
		s := optimizer.SupportConfig{Chunk: 4096, K: k, Decay: 1}
		c.Algorithm, c.InnerSteps, c.Robust, c.DiLoCo.Support = DiLoCo, 50, optimizer.DefaultRobust(), &s
		c.Codec.Codec = codec
	}
}

func nominatedCodec(k, each int, lr float64, codec compression.Codec) func(c *SwarmConfig) {
	return func(c *SwarmConfig) {
		nominated(k, each, optimizer.DefaultRobust(), false, 0)(c)
		c.DiLoCo.OuterLR, c.Codec.Codec = lr, codec
	}
}

func blockNominated(k, each, block int, lr float64, codec compression.Codec) func(c *SwarmConfig) {
	return func(c *SwarmConfig) {
		nominatedCodec(k, each, lr, codec)(c)
		c.DiLoCo.Support.NominateBlock = block
	}
}

func randomSGD(k int, codec compression.Codec) func(c *SwarmConfig) {
	return func(c *SwarmConfig) {
		s := optimizer.SupportConfig{Chunk: 4096, K: k, Decay: 0.95}
		c.Algorithm, c.InnerSteps, c.Robust, c.DiLoCo.Support = DiLoCo, 50, optimizer.DefaultRobust(), &s
		c.DiLoCo.OuterLR, c.DiLoCo.Momentum, c.Codec.Codec = 2, 0, codec
	}
}

func sparseRobust(k int, lr, attack float64) func(c *SwarmConfig) {
	return func(c *SwarmConfig) {
		sc := compression.DefaultSparseConfig()
		sc.K = k
		c.Algorithm, c.InnerSteps, c.Sparse, c.SparseBeta, c.Robust, c.Attack = DiLoCo, 50, &sc, 0.95, optimizer.DefaultRobust(), attack
		c.DiLoCo.OuterLR, c.DiLoCo.Momentum = lr, 0
	}
}

func cycle(k int, codec compression.Codec, feed bool) func(c *SwarmConfig) {
	return func(c *SwarmConfig) {
		randomSGD(k, codec)(c)
		c.DiLoCo.Support.Cycle, c.DiLoCo.Support.FeedRounding = true, feed
	}
}

// signK is the support volunteers run (node.outerSupport with the demo's
// defaults) at k of every 4096: signs with a scale per 1024, residual
// decay 0.5, outer SGD lr 3.
func signK(k int) func(c *SwarmConfig) {
	return func(c *SwarmConfig) {
		feedRounding(blocked(randomSGD(k, compression.Sign), 1024))(c)
		c.DiLoCo.Support.Decay, c.DiLoCo.OuterLR = 0.5, 3
	}
}

// rotK is a support of k of every 4096 rotated coordinates by the hash,
// signs with a scale per block, no residual, outer Nesterov 0.9 at lr
// 1.87: the paper's 0.7 times 4096/k, since a coordinate's rotated share
// is sent in k/4096 of the rounds.
func rotK(k, block int) func(c *SwarmConfig) { return rotKLR(k, block, 1.87) }

// rotKLR is rotK at outer learning rate lr.
func rotKLR(k, block int, lr float64) func(c *SwarmConfig) {
	return func(c *SwarmConfig) {
		s := optimizer.SupportConfig{Chunk: 4096, K: k, Decay: 0, Rotate: true}
		c.Algorithm, c.InnerSteps, c.Robust, c.DiLoCo.Support = DiLoCo, 50, optimizer.DefaultRobust(), &s
		c.DiLoCo.OuterLR, c.DiLoCo.Momentum = lr, 0.9
		c.Codec.Codec, c.Codec.BlockSize = compression.Sign, block
	}
}

// tiled is a support arm with one hash draw a round, tiled over every
// chunk (SupportConfig.Tiled).
func tiled(arm func(c *SwarmConfig)) func(c *SwarmConfig) {
	return func(c *SwarmConfig) {
		arm(c)
		s := *c.DiLoCo.Support
		s.Tiled = true
		c.DiLoCo.Support = &s
	}
}

// robustArm is diloco-h50-robust: int8 through the butterfly's default
// robust rule.
func robustArm(c *SwarmConfig) {
	c.Algorithm, c.InnerSteps, c.Robust = DiLoCo, 50, optimizer.DefaultRobust()
}

// delayed overlaps an arm's exchanges with the next inner phase: the whole
// phase (steps 0, one-step delayed) or its first steps, then landed.
func delayed(arm func(c *SwarmConfig), steps int) func(c *SwarmConfig) {
	return func(c *SwarmConfig) {
		arm(c)
		c.Delayed, c.OverlapSteps = true, steps
	}
}

// aggCodec sets the butterfly's codec of the aggregates on an arm.
func aggCodec(arm func(c *SwarmConfig), codec compression.Codec) func(c *SwarmConfig) {
	return func(c *SwarmConfig) {
		arm(c)
		c.AggCodec = codec
	}
}

// blocked sets the codec's block size on an arm.
func blocked(arm func(c *SwarmConfig), block int) func(c *SwarmConfig) {
	return func(c *SwarmConfig) {
		arm(c)
		c.Codec.BlockSize = block
	}
}

// withAttack makes an arm's last worker hostile (SwarmConfig.Attack).
func withAttack(arm func(c *SwarmConfig), attack float64) func(c *SwarmConfig) {
	return func(c *SwarmConfig) {
		arm(c)
		c.Attack = attack
	}
}

// feedRounding sets SupportConfig.FeedRounding on an arm with a support.
func feedRounding(arm func(c *SwarmConfig)) func(c *SwarmConfig) {
	return func(c *SwarmConfig) {
		arm(c)
		c.DiLoCo.Support.FeedRounding = true
	}
}

func nominated(k, each int, robust optimizer.RobustConfig, fromResidual bool, attack float64) func(c *SwarmConfig) {
	return func(c *SwarmConfig) {
		s := optimizer.SupportConfig{Chunk: 4096, K: k, Nominate: each, Decay: 0.95, NominateFromResidual: fromResidual}
		c.Algorithm, c.InnerSteps, c.Robust, c.DiLoCo.Support, c.Attack = DiLoCo, 50, robust, &s, attack
		c.DiLoCo.OuterLR, c.DiLoCo.Momentum = 3, 0
	}
}

// ArmNames lists the arms' names.
func ArmNames() []string {
	var out []string
	for _, a := range Arms() {
		out = append(out, a.Name)
	}
	return out
}

// ArmResult is one arm's outcome.
type ArmResult struct {
	Arm         string      `json:"arm"`
	Description string      `json:"description"`
	Curve       []EvalPoint `json:"curve"`
	Final       float32     `json:"final_val_loss"`
	BytesPerTok float64     `json:"bytes_per_token"`
	Seconds     float64     `json:"seconds"`
}

// RunConvergence runs the selected arms and writes the report files.
func RunConvergence(ctx context.Context, cfg ConvergenceConfig) ([]ArmResult, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	want := map[string]bool{}
	for _, a := range cfg.Arms {
		want[a] = true
	}
	known := map[string]bool{}
	for _, n := range ArmNames() {
		known[n] = true
	}
	for a := range want {
		if !known[a] {
			return nil, fmt.Errorf("%w: unknown arm %q (known: %s)", ErrConfig, a, strings.Join(ArmNames(), ", "))
		}
	}
	base := func() SwarmConfig {
		a := optimizer.DefaultAdamW()
		a.LR, a.Warmup = cfg.LR, max(cfg.Steps/20, 1)
		return SwarmConfig{Preset: cfg.Preset, Workers: cfg.Workers, Batch: cfg.Batch, SeqLen: cfg.SeqLen,
			InnerSteps: 50, Seed: cfg.Seed, Threads: 1, AdamW: a, DiLoCo: optimizer.DefaultDiLoCo(),
			NoLoCo: optimizer.DefaultNoLoCo(), Codec: int8Codec(), Corpus: nil, EvalBatches: cfg.EvalBatches, Logger: log}
	}
	var warm *model.Checkpoint
	var results []ArmResult
	for _, arm := range Arms() {
		if len(want) > 0 && !want[arm.Name] {
			continue
		}
		if arm.Warm && cfg.WarmSteps == 0 {
			continue
		}
		if arm.Warm && warm == nil {
			c := base()
			c.Algorithm, c.InnerSteps, c.Rounds = Sync, cfg.WarmSteps, 1
			c.AdamW.TotalSteps = cfg.WarmSteps
			say(cfg.Progress, "warm start: %d synchronous steps", cfg.WarmSteps)
			r, err := RunSwarm(ctx, c)
			if err != nil {
				return results, fmt.Errorf("warm start: %w", err)
			}
			mc, _ := model.Preset(cfg.Preset)
			warm = &model.Checkpoint{Config: mc, Spec: model.FullSpec(mc), Params: r.Final}
		}
		c := base()
		arm.configure(&c)
		if c.Algorithm == DiLoCo {
			if cfg.OuterLR > 0 {
				c.DiLoCo.OuterLR = cfg.OuterLR
			}
			if cfg.OuterMomentum != nil {
				c.DiLoCo.Momentum = *cfg.OuterMomentum
			}
			if d := cfg.ResidualDecay; d > 0 {
				c.SparseBeta, c.SubspaceDecay = d, d
				if c.DiLoCo.Support != nil {
					s := *c.DiLoCo.Support
					s.Decay, c.DiLoCo.Support = d, &s
				}
			}
		}
		if c.Algorithm == Sync || c.Algorithm == Single {
			c.InnerSteps = 50
			c.Threads = 2
		}
		c.Rounds = max(cfg.Steps/c.InnerSteps, 1)
		if arm.Warm {
			c.Init = warm
		}
		say(cfg.Progress, "arm %s: %s, %d steps", arm.Name, arm.Description, c.Rounds*c.InnerSteps)
		c.OnEval = func(step int, vl float32) { say(cfg.Progress, "  %s step %d: val loss %.4f", arm.Name, step, vl) }
		r, err := RunSwarm(ctx, c)
		if err != nil {
			return results, fmt.Errorf("arm %s: %w", arm.Name, err)
		}
		results = append(results, ArmResult{Arm: arm.Name, Description: arm.Description, Curve: r.Curve,
			Final: r.FinalValLoss, BytesPerTok: r.BytesPerToken, Seconds: r.Seconds})
	}
	if cfg.Out != "" {
		if err := writeConvergence(cfg, results); err != nil {
			return results, err
		}
	}
	return results, nil
}

func say(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

func writeConvergence(cfg ConvergenceConfig, results []ArmResult) error {
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return fmt.Errorf("node: creating %s: %w", cfg.Out, err)
	}
	js, err := json.MarshalIndent(map[string]any{"config": cfg, "arms": results}, "", "  ")
	if err != nil {
		return fmt.Errorf("experiment: encoding the convergence results: %w", err)
	}
	if err := os.WriteFile(filepath.Join(cfg.Out, "results.json"), js, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cfg.Out, "results.md"), []byte(ConvergenceTable(cfg, results)), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(cfg.Out, "curves.svg"), []byte(CurvesSVG(results)), 0o644)
}

// ConvergenceTable renders the results as a markdown table.
func ConvergenceTable(cfg ConvergenceConfig, results []ArmResult) string {
	mc, _ := model.Preset(cfg.Preset)
	T := cfg.SeqLen
	if T == 0 {
		T = mc.MaxT
	}
	M := float64(cfg.Workers)
	dp := 2 * (M - 1) / M * float64(mc.NumParams()) * 4 / float64(cfg.Batch*T)
	var sync float32
	for _, r := range results {
		if r.Arm == "sync" {
			sync = r.Final
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| arm | final val loss | vs sync | bytes/token | fp32 DP bytes/token ÷ ours | seconds |\n|---|---|---|---|---|---|\n")
	for _, r := range results {
		vs, ratio := "", ""
		if sync > 0 && !strings.HasPrefix(r.Arm, "warm") {
			vs = fmt.Sprintf("%+.2f%%", 100*float64(r.Final-sync)/float64(sync))
		}
		if r.BytesPerTok > 0 {
			ratio = fmt.Sprintf("%.0fx", dp/r.BytesPerTok)
		}
		fmt.Fprintf(&b, "| %s | %.4f | %s | %.2f | %s | %.0f |\n", r.Arm, r.Final, vs, r.BytesPerTok, ratio, r.Seconds)
	}
	fmt.Fprintf(&b, "\nfp32 data-parallel reference: %.0f bytes/token per worker (ring all-reduce of %d fp32 gradients every step, M=%d, %d tokens per worker-step).\n",
		dp, mc.NumParams(), cfg.Workers, cfg.Batch*T)
	return b.String()
}

// CurvesSVG plots validation loss against inner steps per worker.
func CurvesSVG(results []ArmResult) string {
	const W, H, L, R, Tp, Bm = 860, 480, 60, 230, 20, 40
	minY, maxY, maxX := math.Inf(1), math.Inf(-1), 1.0
	for _, r := range results {
		for _, p := range r.Curve {
			minY, maxY = math.Min(minY, float64(p.ValLoss)), math.Max(maxY, float64(p.ValLoss))
			maxX = math.Max(maxX, float64(p.Step))
		}
	}
	if math.IsInf(minY, 0) {
		minY, maxY = 0, 1
	}
	if maxY-minY < 1e-6 {
		maxY = minY + 1
	}
	px := func(x float64) float64 { return L + x/maxX*(W-L-R) }
	py := func(y float64) float64 { return Tp + (maxY-y)/(maxY-minY)*(H-Tp-Bm) }
	colors := []string{"#000000", "#888888", "#1f77b4", "#17becf", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#ff7f0e"}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/><line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n",
		L, H-Bm, W-R, H-Bm, L, Tp, L, H-Bm)
	for i := 0; i <= 5; i++ {
		y := minY + (maxY-minY)*float64(i)/5
		x := maxX * float64(i) / 5
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%.2f</text>`+"\n", L-5, py(y)+4, y)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%.0f</text>`+"\n", px(x), H-Bm+16, x)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">inner steps per worker</text>`+"\n", (W-R+L)/2, H-6)
	fmt.Fprintf(&b, `<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">validation loss</text>`+"\n", H/2, H/2)
	for i, r := range results {
		c := colors[i%len(colors)]
		var pts []string
		for _, p := range r.Curve {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(float64(p.Step)), py(float64(p.ValLoss))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", c, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/><text x="%d" y="%d">%s</text>`+"\n",
			W-R+10, Tp+10+i*18, W-R+30, Tp+10+i*18, c, W-R+35, Tp+14+i*18, r.Arm)
	}
	b.WriteString("</svg>\n")
	return b.String()
}
