package status

import (
	"fmt"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/skein-ml/skein/telemetry"
)

// t0 is the fixed start of every scripted history.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// peerID returns a stable fake libp2p peer ID whose ShortID is "fake%04d".
func peerID(i int) string { return fmt.Sprintf("12D3KooWfake%04dAbCdEfGhJkLmNpQrStUvWxYz", i) }

// testConfig is small enough that tests reach every cap quickly.
func testConfig() StoreConfig {
	c := DefaultStoreConfig()
	c.NoSync = true
	return c
}

func openStore(t testing.TB, cfg StoreConfig) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "history.db")
	s, err := Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

// fakeReport is an honest volunteer's report of one round.
func fakeReport(round uint64, train, val float32, members int) telemetry.Report {
	return telemetry.Report{
		Round: round, StateHash: (round + 1) * 0x9e3779b97f4a7c15, TrainLoss: train, ValLoss: val,
		Tokens: 4096, TokensPerSec: 1000, BytesSent: 1 << 20, BytesRecv: 1 << 20,
		ComputeSeconds: 3, WallSeconds: 4, Members: members, Device: "cpu (4 threads)", Version: "test", UnixMS: t0.UnixMilli(),
	}
}

// feedRun records rounds [from, to] from peers 0..n-1, a round every 10 s,
// losses falling, validation measured by peer 0 only.
func feedRun(t testing.TB, s *Store, n int, from, to uint64) {
	t.Helper()
	if err := feedRounds(s, n, from, to); err != nil {
		t.Fatal(err)
	}
}

// feedRounds is feedRun for other goroutines than the test's.
func feedRounds(s *Store, n int, from, to uint64) error {
	for r := from; r <= to; r++ {
		at := t0.Add(time.Duration(r) * 10 * time.Second)
		for i := range n {
			val := float32(math.NaN())
			if i == 0 {
				val = 4 / float32(1+0.1*float64(r))
			}
			rep := fakeReport(r, 4.5/float32(1+0.1*float64(r))+0.01*float32(i), val, n)
			if err := s.Record(peerID(i), rep, at.Add(time.Duration(i)*time.Millisecond)); err != nil {
				return fmt.Errorf("record round %d peer %d: %w", r, i, err)
			}
		}
	}
	return nil
}

func liveMembers(ids ...int) func() []Member {
	return func() []Member {
		var out []Member
		for _, i := range ids {
			out = append(out, Member{Peer: peerID(i), Role: "trainer", Device: "cpu"})
		}
		return out
	}
}
