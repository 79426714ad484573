package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Class is a kind of volunteer machine and the ranges its figures are drawn
// from (log-uniformly: a rate is as likely to double as to halve).
type Class struct {
	Name      string
	Share     float64 // fraction of the population
	Speed     [2]float64
	MemoryGiB [2]float64
	UpMbps    [2]float64
	DownMbps  [2]float64
	AccessMs  [2]float64
}

// VolunteerClasses is the population the property tests and the projection
// draw from. These are assumptions about who volunteers, not measurements:
// access rates typical of cable (10-40 Mbit/s up), fiber (100-1000), DSL
// (5-12) and datacenter (1-10 Gbit/s) connections; speeds relative to the
// reference thread (measured.go) for a 2-8 thread desktop CPU, a consumer GPU
// (40-120) and datacenter CPUs and GPUs.
var VolunteerClasses = []Class{
	{"home-cable-cpu", 0.25, [2]float64{2, 8}, [2]float64{8, 32}, [2]float64{10, 40}, [2]float64{100, 500}, [2]float64{8, 15}},
	{"home-cable-gpu", 0.20, [2]float64{40, 120}, [2]float64{12, 24}, [2]float64{10, 40}, [2]float64{100, 500}, [2]float64{8, 15}},
	{"home-fiber-gpu", 0.25, [2]float64{40, 120}, [2]float64{12, 24}, [2]float64{100, 1000}, [2]float64{300, 1000}, [2]float64{2, 5}},
	{"home-dsl-cpu", 0.10, [2]float64{2, 6}, [2]float64{8, 16}, [2]float64{5, 12}, [2]float64{20, 80}, [2]float64{15, 25}},
	{"datacenter-cpu", 0.10, [2]float64{16, 64}, [2]float64{64, 256}, [2]float64{1000, 10000}, [2]float64{1000, 10000}, [2]float64{0.3, 1}},
	{"datacenter-gpu", 0.10, [2]float64{200, 400}, [2]float64{40, 80}, [2]float64{1000, 10000}, [2]float64{1000, 10000}, [2]float64{0.3, 1}},
}

// Sampler draws volunteers, deterministically from its seed, in the regions
// of a base network (its region names and latency matrix).
type Sampler struct {
	rng     *rand.Rand
	regions []string
	classes []Class
	next    int
}

// NewSampler returns a sampler over the regions of base, drawing from
// VolunteerClasses.
func NewSampler(seed uint64, base Spec) *Sampler {
	return &Sampler{
		rng:     rand.New(rand.NewPCG(seed, 0x5ce1_9a11)),
		regions: base.Regions,
		classes: VolunteerClasses,
	}
}

// Node draws one volunteer: a region uniformly, a class by share, each
// figure log-uniformly in the class's range. IDs are "v0", "v1", ...
func (s *Sampler) Node() NodeSpec {
	c := s.class()
	id := fmt.Sprintf("v%d", s.next)
	s.next++
	return NodeSpec{
		ID:        id,
		Region:    s.regions[s.rng.IntN(len(s.regions))],
		Class:     c.Name,
		Speed:     s.logUniform(c.Speed),
		MemoryGiB: s.logUniform(c.MemoryGiB),
		UpMbps:    s.logUniform(c.UpMbps),
		DownMbps:  s.logUniform(c.DownMbps),
		AccessMs:  s.logUniform(c.AccessMs),
	}
}

func (s *Sampler) class() Class {
	u := s.rng.Float64()
	for _, c := range s.classes {
		if u < c.Share {
			return c
		}
		u -= c.Share
	}
	return s.classes[len(s.classes)-1]
}

func (s *Sampler) logUniform(r [2]float64) float64 {
	lo, hi := math.Log(r[0]), math.Log(r[1])
	return math.Exp(lo + (hi-lo)*s.rng.Float64())
}

// RandomNetwork returns a network of n volunteers drawn from
// VolunteerClasses in the regions of the built-in network "volunteers20",
// deterministically from seed. Property tests run schedulers on thousands
// of these.
func RandomNetwork(seed uint64, n int) (*Network, error) {
	if n < 1 || n > MaxNodes {
		return nil, fmt.Errorf("%w: %d nodes, want 1 to %d", ErrTooLarge, n, MaxNodes)
	}
	base, err := Builtin("volunteers20")
	if err != nil {
		return nil, err
	}
	s := base.Spec()
	s.Name = fmt.Sprintf("random-%d-%d", n, seed)
	s.Note = ""
	s.Nodes = make([]NodeSpec, 0, n)
	smp := NewSampler(seed, s)
	for range n {
		s.Nodes = append(s.Nodes, smp.Node())
	}
	return NewNetwork(s)
}
