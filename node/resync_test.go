package node

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
	"github.com/skein-ml/skein/telemetry"
	"github.com/skein-ml/skein/transport"
)

// A member whose state hash differs from the majority's at the same round
// finds the majority through the gossiped metadata and adopts their state.
func TestDivergedMemberResyncs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	sw := p2ptest.NewSwarm(t, 6, p2ptest.Options{})
	me, others := sw.Nodes[1], sw.Nodes[2:]
	ctx := context.Background()
	const n = 64
	mine, err := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, make([]float32, n))
	if err != nil {
		t.Fatal(err)
	}
	mine.Round = 3
	// The majority's state: round 3, other weights.
	phi := make([]float32, n)
	for i := range phi {
		phi[i] = float32(i)
	}
	theirs, _ := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, phi)
	theirs.Round = 3
	blob, _ := encodeServed(theirs.State())
	for i, o := range others {
		hash := theirs.StateHash()
		if i == 3 {
			hash = mine.StateHash() // one member agrees with us: 2 against 3
		}
		if err := o.UpdateMeta(ctx, func(m *p2p.Meta) { m.Round, m.StateHash = 3, hash }); err != nil {
			t.Fatal(err)
		}
		o.ServeBulk(func(context.Context, peer.ID, string) (io.ReaderAt, int64, error) {
			return bytes.NewReader(blob), int64(len(blob)), nil
		}, 0)
	}
	var majority []transport.PeerID
	deadline := time.Now().Add(10 * time.Second)
	for len(majority) != 3 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		majority, _ = divergedFrom(me, mine.Round, mine.StateHash())
	}
	if len(majority) != 3 {
		t.Fatalf("majority %v, want the 3 members that agree with each other", majority)
	}
	if err := adoptFrom(ctx, me, nil, mine, n, majority, theirs.StateHash(), nil); err != nil {
		t.Fatal(err)
	}
	if mine.StateHash() != theirs.StateHash() {
		t.Fatal("state not adopted")
	}
	// Now with the majority: nothing to do.
	if got, _ := divergedFrom(me, mine.Round, mine.StateHash()); len(got) != 0 {
		t.Fatalf("still diverged from %v", got)
	}
}

func TestWinningState(t *testing.T) {
	ids := func(names ...string) []transport.PeerID {
		var out []transport.PeerID
		for _, n := range names {
			out = append(out, transport.PeerID(n))
		}
		return out
	}
	tests := []struct {
		name   string
		mine   uint64
		byHash map[uint64][]transport.PeerID
		want   []transport.PeerID
	}{
		{"alone", 7, nil, nil},
		{"all agree", 7, map[uint64][]transport.PeerID{7: ids("a", "b")}, nil},
		{"outnumbered", 7, map[uint64][]transport.PeerID{7: ids("a"), 9: ids("b", "c", "d")}, ids("b", "c", "d")},
		{"majority with me", 7, map[uint64][]transport.PeerID{7: ids("a", "b"), 5: ids("c", "d")}, nil},
		{"two-way tie, mine larger", 9, map[uint64][]transport.PeerID{3: ids("a")}, ids("a")},
		{"two-way tie, mine smaller", 3, map[uint64][]transport.PeerID{9: ids("a")}, nil},
		{"three-way tie", 8, map[uint64][]transport.PeerID{9: ids("a"), 4: ids("b")}, ids("b")},
		{"largest group among others", 1, map[uint64][]transport.PeerID{9: ids("a", "b"), 4: ids("c")}, ids("a", "b")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, got := winningState(tt.mine, tt.byHash); !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// catchUp's choice: a state ahead is followed only when a quorum of the
// other volunteers announces it (issue 9: one member gossiping a huge round
// was adopted by everyone).
func TestQuorumAhead(t *testing.T) {
	a := func(id string, round, hash uint64) announcement {
		return announcement{transport.PeerID(id), round, hash}
	}
	for _, tt := range []struct {
		name   string
		others []announcement
		after  uint64
		want   []transport.PeerID
		hash   uint64
	}{
		{"lone attacker far ahead", []announcement{a("x", 1_000_000, 66), a("b", 5, 7), a("c", 5, 7)}, 5, nil, 0},
		{"two agree ahead", []announcement{a("b", 6, 7), a("c", 6, 7), a("x", 99, 66)}, 5, []transport.PeerID{"b", "c"}, 7},
		{"latest round with a quorum", []announcement{a("b", 6, 7), a("c", 6, 7), a("d", 7, 8), a("e", 7, 9)}, 5, []transport.PeerID{"b", "c"}, 7},
		{"excluded: the one member that finished, a joiner behind", []announcement{a("b", 6, 7), a("c", 0, 0)}, 5, []transport.PeerID{"b"}, 7},
		{"lone member a few rounds ahead", []announcement{a("b", 7, 7), a("c", 5, 8)}, 5, []transport.PeerID{"b"}, 7},
		{"lone member too far ahead", []announcement{a("b", 8, 7), a("c", 5, 8)}, 5, nil, 0},
		{"only other volunteer", []announcement{a("b", 9, 7)}, 5, []transport.PeerID{"b"}, 7},
		{"nobody ahead", []announcement{a("b", 5, 7), a("c", 4, 7)}, 5, nil, 0},
		{"no hash announced", []announcement{a("b", 6, 0), a("c", 6, 0)}, 5, nil, 0},
		{"more announcers win a tie in round", []announcement{a("b", 6, 7), a("c", 6, 7), a("d", 6, 8), a("e", 6, 8), a("f", 6, 8)}, 5,
			[]transport.PeerID{"d", "e", "f"}, 8},
	} {
		t.Run(tt.name, func(t *testing.T) {
			hash, got := quorumAhead(tt.others, tt.after)
			if !slices.Equal(got, tt.want) || hash != tt.hash {
				t.Fatalf("got %v (hash %d), want %v (hash %d)", got, hash, tt.want, tt.hash)
			}
		})
	}
}

// A member serving a state other than the one announced is refused: the
// download must have the hash the run announces.
func TestAdoptRefusesForgedState(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	sw := p2ptest.NewSwarm(t, 3, p2ptest.Options{})
	me, liar := sw.Nodes[1], sw.Nodes[2]
	const n = 64
	mine, _ := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, make([]float32, n))
	honest, _ := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, make([]float32, n))
	honest.Round = 4
	forged := make([]float32, n)
	for i := range forged {
		forged[i] = 1000
	}
	blob, _ := encodeServed(4, forged, make([]float32, n))
	liar.ServeBulk(func(context.Context, peer.ID, string) (io.ReaderAt, int64, error) {
		return bytes.NewReader(blob), int64(len(blob)), nil
	}, 0)
	id := transport.PeerID(liar.ID().String())
	err := adoptFrom(context.Background(), me, nil, mine, n, []transport.PeerID{id}, honest.StateHash(), nil)
	if !errors.Is(err, ErrBadState) || mine.Round != 0 {
		t.Fatalf("forged state: err %v, round %d; want ErrBadState and nothing adopted", err, mine.Round)
	}
}

// A member that reported a round with one state and then took the run's
// other state for that round reports the round again with the state it
// goes on from (the bootstrap replaces its earlier report); nothing is sent
// when the state did not change or belongs to another round.
func TestCorrectedReport(t *testing.T) {
	dl, err := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, make([]float32, 8))
	if err != nil {
		t.Fatal(err)
	}
	dl.Round = 7
	var out bytes.Buffer
	v := &Volunteer{dl: dl, reporter: &reporter{queue: make(chan telemetry.Report, 1)}}
	v.cfg.Progress = &out
	v.lastSent = telemetry.Report{Round: 7, StateHash: 0xaaaa, Tokens: 640, TrainLoss: 3.5}
	for _, c := range []struct {
		name  string
		round uint64
		hash  uint64
		want  bool
	}{
		{"same state", 7, 0xaaaa, false},
		{"another round", 8, 0xbbbb, false},
		{"taken the run's state", 7, 0xbbbb, true},
		{"already corrected", 7, 0xbbbb, false},
	} {
		dl.Round, v.stateHash = c.round, c.hash
		v.corrected()
		select {
		case rep := <-v.reporter.queue:
			if !c.want {
				t.Fatalf("%s: sent %+v", c.name, rep)
			}
			if rep.Round != 7 || rep.StateHash != 0xbbbb || rep.Tokens != 640 || rep.TrainLoss != 3.5 {
				t.Fatalf("%s: sent %+v, want round 7's report with state bbbb", c.name, rep)
			}
		default:
			if c.want {
				t.Fatalf("%s: nothing sent", c.name)
			}
		}
	}
	if !strings.Contains(out.String(), "round 7: ended it apart from the run") {
		t.Fatalf("console: %q", out.String())
	}
}
