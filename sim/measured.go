package sim

import "math"

// Costs measured in BENCHMARKS.md. Every duration the simulator produces is
// built from these; a figure that is not a measurement says so. The sections
// and rows named below are those of BENCHMARKS.md; when a figure is derived,
// the arithmetic is written next to it.

// Compute: "Training throughput (tokens/s) vs PyTorch", the table "Where one
// thread of `small` spends a step" (preset small: C = 384, 6 layers; batch
// B = 8, T = 256; thread CPU time per step, the "after" column). The
// reference machine (speed 1) is that thread.
const (
	// RefStepSeconds is the whole step, row "**step**": 740.9 ms.
	RefStepSeconds = 0.7409
	// RefForwardSeconds sums the forward rows: GEMM forward 205.9, attention
	// forward 19.3, GELU forward 4.8, LayerNorm forward 2.2, half of
	// "residual forward + backward" 2.5, "encoder, softmax + cross-entropy"
	// 0.8 = 235.5 ms.
	RefForwardSeconds = 0.2355
	// RefBackwardSeconds sums the backward rows: GEMM backward 435.9,
	// attention backward 36.8, GELU backward 6.4, LayerNorm backward 4.6,
	// half of the residual row 2.5, Zero 9.9 = 496.1 ms. (AdamW 5.6 and
	// grad norm + clip 2.6 make up the rest of the step.)
	RefBackwardSeconds = 0.4961
	// RefLayers is the number of transformer layers in that step (small).
	RefLayers = 6
	// RefParams is the small preset's parameter count (model/config_test.go:
	// ~10.8M; BENCHMARKS.md "small (10.8M)" in the codec table).
	RefParams = 10.8e6
	// RefTokens is the tokens per measured step: B*T = 8*256.
	RefTokens = 8 * 256
	// RefChannels is the small preset's width C.
	RefChannels = 384
)

// RefLayerForwardSeconds is one layer's forward over one microbatch of
// RefTokens tokens on the reference machine: 235.5 ms / 6 layers = 39.25 ms.
// The small preset's head and loss (vocabulary 256) are folded in.
const RefLayerForwardSeconds = RefForwardSeconds / RefLayers

// BackwardRatio is backward time over forward time as measured:
// 496.1 / 235.5 = 2.11. The SkipPipe paper's cost model uses 1.5
// (ALGORITHMS.md 3); ours is what our kernels do.
const BackwardRatio = RefBackwardSeconds / RefForwardSeconds

// LossFactor is stage 0's head and loss, as a fraction of its forward. Not
// measured: the paper's cost model (ALGORITHMS.md 3, "loss 0.25*w_v"); our
// byte vocabulary makes our own head unrepresentatively small (0.8 ms of a
// 740.9 ms step).
const LossFactor = 0.25

// Goodput is the fraction of a link's rate a bulk transfer achieves:
// "p2p: bulk throughput and join time", row "same, 16 connections (lanes)":
// 0.88 of an emulated 100 Mbit/s, 40 ms, 0.1% loss link. (One stream gets
// 0.14; the loss-free link 0.93 with 16 connections.)
const Goodput = 0.88

// Codec figures: "Compression codecs", row minmax8 (the collective's codec),
// per core, on the fp32 input bytes.
const (
	// MinMax8EncodeBps is 3.73 GB/s.
	MinMax8EncodeBps = 3.73e9
	// MinMax8DecodeBps is 7.85 GB/s.
	MinMax8DecodeBps = 7.85e9
	// MinMax8Ratio is "x smaller than fp32": 3.88, so a parameter costs
	// 4/3.88 = 1.03 bytes on the wire.
	MinMax8Ratio = 3.88
)

// WireCodec is a codec's figures as the projection uses them: how much
// smaller than fp32 a pseudo-gradient gets, and how fast one core encodes
// and decodes it (bytes of fp32 input per second).
type WireCodec struct {
	Name                 string
	Ratio                float64 // fp32 bytes / wire bytes
	EncodeBps, DecodeBps float64
}

// MinMax8Codec is today's collective codec (the figures above).
var MinMax8Codec = WireCodec{Name: "minmax8", Ratio: MinMax8Ratio, EncodeBps: MinMax8EncodeBps, DecodeBps: MinMax8DecodeBps}

// SparseCodec is the sparse codec at 64 of every 4096 (BENCHMARKS.md, "The
// sparse codec"): 0.174 bits per parameter (32/0.174 = 184x smaller than
// fp32), encoded (selection included) at 0.92-1.23 GB/s of fp32 input on
// one core (1.0 taken); decoded at SparseDecodeBps.
var SparseCodec = WireCodec{Name: "sparse", Ratio: 32 / 0.1739, EncodeBps: 1.0e9, DecodeBps: SparseDecodeBps}

// SupportCodec is a shared support of 64 of every 4096 coordinates
// through the butterfly (wire.outer = "support"): minmax8 on the
// compacted vector, so 64x smaller than minmax8 with no positions on the
// wire; its local work (support, error feedback, state hash, one member's
// codec work at M = 8, outer step: BenchmarkSupportRound at 124M) ran at
// 0.31-0.38 GB/s of fp32 parameters on one core (0.31 taken, the state
// hash included, which the other codecs' figures leave out); the owners
// decode the compacted parts at minmax8's speed.
var SupportCodec = WireCodec{Name: "support", Ratio: MinMax8Ratio * 4096 / 64, EncodeBps: 0.31e9, DecodeBps: MinMax8DecodeBps * 4096 / 64}

// SupportSignCodec is the support volunteers ran with `skein demo --outer
// support` until session 13 (the demo now takes a scale per 256, 9% more
// bytes, not projected): 1536 of every 4096 coordinates with 1-bit signs
// and a scale per 1024 (1.03125 bits a value) through the butterfly, 2647x less
// traffic than fp32 data-parallel at 0.7-1.2% lower loss than the dense
// robust round from scratch and +1.95% warm in the convergence benchmark
// (BENCHMARKS.md, issue [3/4], sessions 8 and 13):
// 32/(1536/4096*1.03125) = 83x smaller than fp32; its local work
// (BenchmarkSupportRound/sign1536 at 124M, the state hash included) ran at
// SupportSignBps on one core; the owners decode the compacted parts at
// SignDecodeBps.
var SupportSignCodec = WireCodec{Name: "support-sign", Ratio: 32 / (1536.0 / 4096 * (1 + 32.0/1024)), EncodeBps: SupportSignBps, DecodeBps: SignDecodeBps * 4096 / 1536}

// SupportSignBps (1.52 s a round at 124M, the state hash's 0.55 s
// included: 0.327 GB/s of fp32 parameters; session 8 had 2.55 s)
// and SignDecodeBps (BenchmarkDecode/sign/zstd0: 3.19-3.20 GB/s of fp32
// output in session 8; 22.1-30.3 GB/s with session 16's AVX2 decoding, the
// lowest taken, against 7.3-7.6 GB/s for the Go loop in the same run): see
// SupportSignCodec.
const (
	SupportSignBps = 0.327e9
	SignDecodeBps  = 22.1e9
)

// SupportRotCodec is the support `skein demo --outer support` runs since
// session 14 (wire.rotate): 1536 of every 4096 coordinates of a fixed
// randomized Hadamard basis per chunk, 1-bit signs with a scale per 256
// (1.125 bits a value), no residual and the outer Nesterov momentum: 2435x
// less traffic than fp32 data-parallel in the convergence benchmark, 2.25%
// below the dense robust round from scratch and +0.29..+1.06% warm at four
// seeds (BENCHMARKS.md, issue [3/4], sessions 14-16; tiled, +0.63% warm):
// 32/(1536/4096*1.125) = 76x smaller than fp32; its local work
// (BenchmarkSupportRound/rot1536 at 124M, the state hash and the two
// transforms included) ran at SupportRotBps on one core; the owners decode
// the compacted parts at SignDecodeBps.
var SupportRotCodec = WireCodec{Name: "support-rot", Ratio: 32 / (1536.0 / 4096 * (1 + 32.0/256)), EncodeBps: SupportRotBps, DecodeBps: SignDecodeBps * 4096 / 1536}

// SupportRotBps: 1.26-1.30 s a round at 124M (mean 1.28 s, the state hash's
// 0.56 s included: 0.390 GB/s of fp32 parameters), session 16, tiled
// (BenchmarkSupportRound/rot1536-tiled, the demo's rule since then); the
// same rule untiled took 1.44-1.50 s, and 1.79-1.91 s before session 16's
// AVX2 median and fused passes.
const SupportRotBps = 0.390e9

// SparseDecodeBps is the sparse codec's decode-and-add speed on one core,
// per byte of fp32 output: BenchmarkSparseVsMinMax8/sparse-decode measured
// 1.68-2.28 GB/s.
const SparseDecodeBps = 2.0e9

// ButterflyMeasured is the "Collective: the butterfly against the ring"
// table: one round of 1M parameters (1 MB per member, 8-bit), every member
// behind a 50 Mbit/s uplink with 30 ms one-way latency, 2 owners per part,
// cross-checked. The projection's butterfly model is compared with it.
var ButterflyMeasured = []struct {
	Members      int
	Seconds      float64
	MBSentMember float64
}{
	{4, 0.732, 2.44},
	{8, 0.918, 2.85},
	{16, 1.242, 3.07},
}

// ActivationBytes is what crosses a stage boundary for one microbatch of the
// reference shape: B*T*C values in bf16 (ALGORITHMS.md 5, "activations in
// pipelines: bf16/fp16 is the safe default"): 8*256*384*2 = 1,572,864 bytes.
// A gradient going back is the same size.
const ActivationBytes = RefTokens * RefChannels * 2

// WireOverhead is what framing, hashes and signatures add to a collective's
// payload: bytes sent per member over the payload's share, from the
// "Collective" table: the ring sent 1.62, 1.89, 2.03 MB where 2(M-1)/M MB
// is 1.50, 1.75, 1.875 (1.08x at M = 4, 8, 16); the butterfly 2.44, 2.85,
// 3.07 MB where 3(M-1)/M MB is 2.25, 2.625, 2.81 (1.08-1.09x).
const WireOverhead = 1.08

// Deadlines of the collective's phases: optimizer.DefaultButterflyConfig
// waits twice the smoothed observed phase time (plus deviations, ignored
// here), clamped to [2 s, 600 s]. A member that dies mid-round costs the
// survivors one such deadline, or less when the membership drops it sooner
// (DetectionSeconds).
// ReadyWait (5 s in the same config) is how long a leader waits for members
// to report ready before forming the group from those that have.
const (
	ReadyWait      = 5.0
	DeadlineFactor = 2
	MinDeadline    = 2.0
	MaxDeadline    = 600.0
)

// Failure detection: memberlist's DefaultWANConfig, which volunteers run
// (p2p.WANTiming; sim's tests check these against memberlist's).
const (
	// ProbeInterval: each member probes one other per interval, round
	// robin, so across the swarm a member is probed about once per
	// interval; a probe that fails (3 s timeout, then indirect probes)
	// makes the prober suspect it.
	ProbeInterval = 5.0
	// SuspicionMult sets the suspicion timeout: SuspicionMult *
	// max(1, log10(n)) * ProbeInterval once SuspicionMult-2 other members
	// confirm the suspicion (longer until then, up to
	// SuspicionMaxTimeoutMult times that).
	SuspicionMult = 6
	// GossipInterval and GossipNodes spread the death: each member that
	// knows passes it to GossipNodes others per interval.
	GossipInterval = 0.5
	GossipNodes    = 4
)

// DetectionSeconds is how long after a member of a swarm of n dies the
// others' membership drops it, the failure detector's delay: one probe
// interval until a probe of it fails; the suspicion timeout, or the time
// the SuspicionMult-2 confirmations memberlist waits for take (each another
// member's probe, about one per interval), whichever is longer; then the
// gossip intervals the news takes to reach all n. 35.5 s at n = 4, 66.5 s
// at 100, 97.5 s at 1000, 128 s at 10,000.
func DetectionSeconds(n int) float64 {
	timeout := SuspicionMult * max(1, math.Log10(max(float64(n), 1))) * ProbeInterval
	if k := SuspicionMult - 2; n-2 >= k {
		timeout = max(timeout, float64(k)*ProbeInterval)
	}
	rounds := 0
	for told := 1; told < n; told *= 1 + GossipNodes {
		rounds++
	}
	return ProbeInterval + timeout + float64(rounds)*GossipInterval
}
