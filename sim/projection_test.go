package sim

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/hashicorp/memberlist"
)

// defaultProjection is computed once for the tests that read it.
var defaultProjection = sync.OnceValues(func() (Projection, error) { return Project(DefaultProjectionConfig()) })

// uniform4 is a swarm computable by hand: 4 members in one region, 10 ms
// one way, 1e6 bytes/s up and down, goodput 1.
func uniform4() *population {
	p := &population{latency: [][]float64{{0.010}}, goodput: 1}
	for range 4 {
		p.members = append(p.members, member{up: 1e6, down: 1e6})
	}
	return p
}

func TestCollectivesHandComputed(t *testing.T) {
	p := uniform4()
	const wire = 4e6 // fp32 0: no codec time
	tests := []struct {
		name string
		got  float64
		want float64
	}{
		// 2(M-1) = 6 steps of a 1e6-byte chunk: 6 * (0.01 + 1) = 6.06 s.
		{"ring", p.ring([][]int{{0, 1, 2, 3}}, wire, 0), 6.06},
		// Groups {0,1} {2,3}: reduce-scatter and all-gather inside, one step
		// each of 2e6 bytes (2.01 s); across, two rings of 2 members on
		// 2e6-byte shards, 2 steps of 1e6 (1.01 s): 4.02 + 2.02 = 6.04 s.
		{"groups of 2", p.hierarchical([]int{0, 1, 2, 3}, 2, wire, 0), 6.04},
		// G = M is one ring.
		{"one group", p.hierarchical([]int{0, 1, 2, 3}, 4, wire, 0), 6.06},
		// 5 latencies (0.05) + scatter 2 * 3/4 * 4e6 / 1e6 (6 s) + gather
		// 3/4 * 4e6 / 1e6 (3 s) = 9.05 s.
		{"butterfly", p.butterfly(wire, 0), 9.05},
	}
	for _, tt := range tests {
		if math.Abs(tt.got-tt.want) > 1e-9 {
			t.Errorf("%s: %v s, want %v", tt.name, tt.got, tt.want)
		}
	}
	// NoLoCo: each member sends 2 * 4e6 bytes to its partner, 8.01 s, and
	// with no churn the round is the inner phase plus that (codec: 0 bytes).
	pt := collectives{members: 4, pairs: p.noloco(wire, 0, 1)}.point(DesignNoLoCo, 100, 0)
	if math.Abs(pt.Collective-8.01) > 1e-9 || math.Abs(pt.Round-108.01) > 1e-9 {
		t.Errorf("noloco: collective %v round %v, want 8.01 and 108.01", pt.Collective, pt.Round)
	}
}

func TestChurnArithmetic(t *testing.T) {
	// inner 100 s, collective 10 s, deaths at 0.01/s among those waited on.
	// Deadline: 2 * 10 = 20 s. Ready wait: 5 * (1 - e^-1) = 3.160603 s.
	// Redo: failures are geometric with q = 1 - e^-0.1, q/(1-q) = e^0.1 - 1
	// = 0.105171; 20 * 0.105171 = 2.103418 s: 115.264021 s in all.
	// Wait: the collective runs to its deadline (10 s more) with probability
	// 1 - e^-0.1 = 0.095163: 113.160603 + 0.951626 = 114.112229 s; when the
	// membership drops the dead member 3 s after its death, 3 s more:
	// 113.160603 + 0.285488 = 113.446091 s.
	tests := []struct {
		name      string
		got, want float64
	}{
		{"redo, no churn", redoRound(100, 10, 0), 110},
		{"wait, no churn", waitRound(100, 10, 0, 3), 110},
		{"redo", redoRound(100, 10, 0.01), 115.264021},
		{"wait, detected after the deadline", waitRound(100, 10, 0.01, 60), 114.112229},
		{"wait, detected before the deadline", waitRound(100, 10, 0.01, 3), 113.446091},
		{"detection, 4 members", DetectionSeconds(4), 5 + 30 + 0.5},
		{"detection, 100 members", DetectionSeconds(100), 5 + 60 + 1.5},
		{"detection, 1000 members", DetectionSeconds(1000), 5 + 90 + 2.5},
		{"detection, 10000 members", DetectionSeconds(10000), 5 + 120 + 3},
		{"deadline floor", deadline(0.1), MinDeadline},
		{"deadline cap", deadline(1e4), MaxDeadline},
	}
	for _, tt := range tests {
		if math.Abs(tt.got-tt.want) > 1e-6 {
			t.Errorf("%s: %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	if r := redoRound(100, 1e4, 1); !math.IsInf(r, 1) {
		t.Errorf("a redo that always fails: %v, want +Inf", r)
	}
}

// TestDetectionIsMemberlistWAN: the failure detector the projection
// charges is the one volunteers run, memberlist's DefaultWANConfig.
func TestDetectionIsMemberlistWAN(t *testing.T) {
	c := memberlist.DefaultWANConfig()
	got := []float64{ProbeInterval, SuspicionMult, GossipInterval, GossipNodes}
	want := []float64{c.ProbeInterval.Seconds(), float64(c.SuspicionMult), c.GossipInterval.Seconds(), float64(c.GossipNodes)}
	if !slices.Equal(got, want) {
		t.Fatalf("probe interval, suspicion mult, gossip interval, gossip nodes: %v, memberlist's WAN config has %v", got, want)
	}
}

func TestProjectionShape(t *testing.T) {
	p, err := defaultProjection()
	if err != nil {
		t.Fatal(err)
	}
	c := p.Config
	if len(p.Points) != len(c.Members)*len(c.ChurnPerHour)*len(Designs) {
		t.Fatalf("%d points", len(p.Points))
	}
	for _, pt := range p.Points {
		if !(pt.Utilisation >= 0 && pt.Utilisation <= 1) || pt.Round < p.Inner+pt.Collective-1e-9 {
			t.Errorf("%+v: utilisation out of [0, 1] or round shorter than inner + collective (%v)", pt, p.Inner)
		}
	}
	for _, d := range Designs {
		for _, m := range c.Members {
			prev := 0.0
			for _, churn := range c.ChurnPerHour {
				r := p.point(d, m, churn).Round
				if r < prev {
					t.Errorf("%s M=%d: round %v at churn %v is shorter than at lower churn (%v)", d, m, r, churn, prev)
				}
				prev = r
			}
		}
	}
	// The ring's 2(M-1) latencies: its collective grows with M; the
	// butterfly's five do not (its bytes per member are flat in M).
	lo, hi := c.Members[0], c.Members[len(c.Members)-1]
	if ring := p.point(DesignRing, hi, 0).Collective / p.point(DesignRing, lo, 0).Collective; ring < 5 {
		t.Errorf("the ring's collective grows only %.1fx from M=%d to %d", ring, lo, hi)
	}
	if bf := p.point(DesignButterfly, hi, 0).Collective / p.point(DesignButterfly, lo, 0).Collective; bf > 1.5 {
		t.Errorf("the butterfly's collective grows %.1fx from M=%d to %d", bf, lo, hi)
	}
}

// TestProjectionFilesUpToDate: bench/results/projection.{md,svg} are what
// the code produces; after a change, go run ./sim/cmd/project.
func TestProjectionFilesUpToDate(t *testing.T) {
	p, err := defaultProjection()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]byte{"projection.md": []byte(p.Markdown()), "projection.svg": p.SVG()} {
		got, err := os.ReadFile(filepath.Join("..", "bench", "results", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("bench/results/%s is stale: run go run ./sim/cmd/project", name)
		}
	}
}

func TestProjectionConfigValidate(t *testing.T) {
	bad := []func(*ProjectionConfig){
		func(c *ProjectionConfig) { c.Members = nil },
		func(c *ProjectionConfig) { c.Members = []int{1} },
		func(c *ProjectionConfig) { c.Members = []int{MaxProjectionMembers + 1} },
		func(c *ProjectionConfig) { c.ChurnPerHour = []float64{-1} },
		func(c *ProjectionConfig) { c.ChurnPerHour = []float64{math.NaN()} },
		func(c *ProjectionConfig) { c.Params = 0 },
		func(c *ProjectionConfig) { c.InnerSteps = 0 },
		func(c *ProjectionConfig) { c.MinUplinkMbps = math.Inf(1) },
	}
	for i, mutate := range bad {
		c := DefaultProjectionConfig()
		mutate(&c)
		if _, err := Project(c); !errors.Is(err, ErrConfig) {
			t.Errorf("case %d: %v", i, err)
		}
	}
}
