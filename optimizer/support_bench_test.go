package optimizer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/transport"
)

// BenchmarkSupportRound is one member's local work in a round with a
// shared support (issue [3/4]) at M = 8, of 64 of every 4096 coordinates
// with minmax8 (half by momentum, or nominated) or of 1792 by the hash
// with signs and FeedRounding (what crossed the wire decoded again), or of
// 1536 with a sign scale per 1024 and residual decay 0.5, or of 1536
// rotated coordinates (SupportConfig.Rotate: the two transforms a round)
// with a scale per 256, no residual and the outer momentum (the demo's),
// drawn for every chunk or once and tiled (SupportConfig.Tiled):
// choosing the support from the momentum (or nominations), the error
// feedback (residual plus pseudo-gradient, compacted), the state hash the
// round starts from, the butterfly's codec work of one member on the
// compacted vector (codecRound: its contribution encoded, two owned parts
// decoded from M members and robustly aggregated, their aggregates encoded,
// the M aggregate parts decoded), the outer step and the residual's update.
// Only the network is left out. The state hash is timed alone too
// (hash_s/op, the certification every round needs, dense or not), and
// codec_s/op is the rest. Throughput is bytes of fp32 parameters;
// sizes 16M and GPT-2 small's 124M (4 GB of state and buffers):
//
//	go test ./optimizer -run '^$' -bench SupportRound -benchtime 3x -cpu 1
func BenchmarkSupportRound(b *testing.B) {
	for _, n := range []int{16 << 20, 124_439_808} {
		for _, arm := range []struct {
			name         string
			k, nominate  int
			codec        compression.Codec
			fromMomentum bool
			block        int
			decay        float32
			rotate       bool
			tiled        bool
		}{
			{"support", 64, 0, compression.MinMax8, true, 0, 0.95, false, false},
			{"nominated", 64, 16, compression.MinMax8, false, 0, 0.95, false, false},
			{"random1792-sign", 1792, 0, compression.Sign, false, 0, 0.95, false, false},
			{"sign1536", 1536, 0, compression.Sign, false, 1024, 0.5, false, false},
			{"rot1536", 1536, 0, compression.Sign, false, 256, 0, true, false},
			{"rot1536-tiled", 1536, 0, compression.Sign, false, 256, 0, true, true},
		} {
			b.Run(fmt.Sprintf("%s/%dM", arm.name, (n+500_000)/1_000_000), func(b *testing.B) {
				cfg := DefaultDiLoCo()
				cfg.OuterLR, cfg.Momentum, cfg.NormGrowth = 3, 0, 0
				s := SupportConfig{Chunk: 4096, K: arm.k, Decay: arm.decay, Nominate: arm.nominate, FeedRounding: arm.codec == compression.Sign && !arm.rotate, Rotate: arm.rotate, Tiled: arm.tiled}
				if arm.rotate { // the outer momentum carries what no residual does
					cfg.OuterLR, cfg.Momentum = 1.87, 0.9
				}
				if arm.fromMomentum {
					s.FromMomentum = arm.k / 2
				}
				if arm.nominate > 0 {
					cfg.Nominator = selfNominator{}
				}
				cfg.Support = &s
				phi := make([]float32, n)
				coll, err := newCodecRound(8, s.SupportLen(n), arm.codec, arm.block)
				if err != nil {
					b.Fatal(err)
				}
				d, err := NewDiLoCo(cfg, coll, phi)
				if err != nil {
					b.Fatal(err)
				}
				r := rand.New(rand.NewPCG(1, 2))
				theta := make([]float32, n)
				for i := range d.Mom {
					d.Mom[i] = float32(r.NormFloat64())
				}
				var hashTime time.Duration
				round := func() {
					b.StopTimer()
					// The state hash the round starts from, timed alone
					// (the round computes it again): the round's time
					// less this is the codec's work (the codec_s/op metric).
					t0 := time.Now()
					StateHashOf(d.Round, d.Phi, d.Mom)
					hashTime += time.Since(t0)
					x := r.Uint64() | 1
					for i := range theta { // a cheap xorshift pseudo-gradient, in [-1e-3, 1e-3)
						x ^= x << 13
						x ^= x >> 7
						x ^= x << 17
						theta[i] = d.Phi[i] - float32(int32(x>>32))*(1e-3/(1<<31))
					}
					b.StartTimer()
					if _, err := d.OuterStep(context.Background(), theta); err != nil {
						b.Fatal(err)
					}
				}
				// A volunteer's buffers live across rounds: the first
				// round's page faults (seconds at 124M in some sandboxes)
				// are not a round's cost.
				round()
				b.SetBytes(4 * int64(n))
				hashTime = 0
				b.ResetTimer()
				for range b.N {
					round()
				}
				hash := hashTime.Seconds() / float64(b.N)
				b.ReportMetric(hash, "hash_s/op")
				b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)-hash, "codec_s/op")
			})
		}
	}
}

// codecRound is a collective of one member that does the local codec work
// of a butterfly member in a group of M (replicas 2) on a vector of n: it
// encodes its contribution, decodes M members' inputs for each of the two
// parts it owns (its own and M-1 others', encoded from other vectors once,
// at the first round: the robust rule's sort costs more on distinct
// values than on M copies of one), aggregates them with the default
// robust rule, encodes the two aggregates and decodes the M aggregate
// parts into the result (the parts it does not own stand in for the
// others'). The result is its own contribution, decoded.
type codecRound struct {
	M      int
	enc    *compression.Encoder
	dec    *compression.Decoder
	robust RobustConfig
	in     [][]float32
	agg    []float32
	buf    []byte
	parts  [][]byte
	others [2][][]byte // the other members' frames of the two owned parts
	scr    []float32
}

func newCodecRound(M, n int, codec compression.Codec, block int) (*codecRound, error) {
	cfg := DefaultButterflyConfig(n, nil, 0.05)
	cfg.Codec.Codec = codec
	if block > 0 {
		cfg.Codec.BlockSize = block
	}
	enc, err := compression.NewEncoder(cfg.Codec)
	if err != nil {
		return nil, err
	}
	dec, err := compression.NewDecoder(cfg.Codec)
	if err != nil {
		return nil, err
	}
	L := (n + M - 1) / M
	c := &codecRound{M: M, enc: enc, dec: dec, robust: cfg.Robust, agg: make([]float32, L)}
	for range M {
		c.in = append(c.in, make([]float32, L))
	}
	return c, nil
}

func (*codecRound) Self() transport.PeerID { return "me" }

func (c *codecRound) AllReduceMean(ctx context.Context, round uint64, x, out []float32) (RoundStats, error) {
	return c.AllReduceSent(ctx, round, 0, x, out, nil)
}

// AllReduceSent also decodes its own parts into sent, as the butterfly
// does for SupportConfig.FeedRounding.
func (c *codecRound) AllReduceSent(_ context.Context, round, _ uint64, x, out, sent []float32) (RoundStats, error) {
	L := len(c.agg)
	part := func(v []float32, p int) []float32 { return v[min(p*L, len(v)):min((p+1)*L, len(v))] }
	// The contribution, part by part.
	c.parts = c.parts[:0]
	var err error
	for p := range c.M {
		start := len(c.buf)
		if c.buf, err = c.enc.Append(c.buf, part(x, p), round); err != nil {
			return RoundStats{}, err
		}
		c.parts = append(c.parts, c.buf[start:])
	}
	c.buf = c.buf[:0]
	if c.others[0] == nil {
		r := rand.New(rand.NewPCG(uint64(len(x)), 3))
		for p := range c.others {
			y := make([]float32, len(part(x, p)))
			for range c.M - 1 {
				for i := range y {
					y[i] = float32(r.NormFloat64()) * 1e-3
				}
				f, err := c.enc.Append(nil, y, round)
				if err != nil {
					return RoundStats{}, err
				}
				c.others[p] = append(c.others[p], f)
			}
		}
	}
	// Two owned parts: M inputs each, aggregated and encoded.
	for _, p := range []int{0, 1} {
		n := len(part(x, p))
		inputs := c.in[:0:0]
		for m := range c.M {
			f := c.parts[p]
			if m > 0 {
				f = c.others[p][m-1]
			}
			v, err := c.dec.DecodeBytes(f, c.in[m][:n])
			if err != nil {
				return RoundStats{}, err
			}
			inputs = append(inputs, v)
		}
		c.scr = c.robust.Aggregate(c.agg[:n], inputs, c.scr)
		if c.buf, err = c.enc.Append(c.buf[:0], c.agg[:n], round); err != nil {
			return RoundStats{}, err
		}
	}
	if sent != nil {
		for p := range c.M {
			if _, err := c.dec.DecodeBytes(c.parts[p], part(sent, p)); err != nil {
				return RoundStats{}, err
			}
		}
	}
	// The M aggregate parts.
	for p := range c.M {
		if _, err := c.dec.DecodeBytes(c.parts[p], part(out, p)); err != nil {
			return RoundStats{}, err
		}
	}
	return RoundStats{Round: round}, nil
}

// selfNominator is a round of one member: the union is its own.
type selfNominator struct{}

func (selfNominator) Nominate(_ context.Context, _ uint64, own []int32) ([]int32, error) {
	return own, nil
}

// BenchmarkStateHash is the state hash every round starts from (phi and
// the momentum of GPT-2 small's 124M, 1 GB), part of BenchmarkSupportRound
// and of every dense round alike: the round's codec work is the
// difference. With -cpu 1,N it shows the chunks spread over N cores.
//
//	go test ./optimizer -run '^$' -bench 'SupportRound|StateHash' -benchtime 3x -cpu 1
func BenchmarkStateHash(b *testing.B) {
	const n = 124_439_808
	phi, mom := make([]float32, n), make([]float32, n)
	for i := range phi {
		phi[i], mom[i] = float32(i), -float32(i)
	}
	StateChunkHashes(phi, mom) // not the page faults
	b.SetBytes(8 * n)
	b.ResetTimer()
	for range b.N {
		StateChunkHashes(phi, mom)
	}
}

// BenchmarkSupportDraws is a round's support (the hash's draws alone: no
// momentum part) over a 124M model: sign1536's 1536 of every 4096.
func BenchmarkSupportDraws(b *testing.B) {
	for _, k := range []int{64, 1536, 2048} {
		b.Run(fmt.Sprintf("k%d", k), func(b *testing.B) {
			c := SupportConfig{Chunk: 4096, K: k, Decay: 1}
			mom := make([]float32, 124_439_808)
			dst := c.Support(nil, mom, 0)
			b.SetBytes(4 * int64(len(mom)))
			b.ResetTimer()
			for i := range b.N {
				dst = c.Support(dst[:0], mom, uint64(i))
			}
		})
	}
}
