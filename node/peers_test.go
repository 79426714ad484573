package node

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
)

// DiLoCo rounds over real libp2p streams on loopback: four volunteers and a
// seed (which does not train) agree on the state after every round.
func TestDiLoCoOverP2P(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	sw := p2ptest.NewSwarm(t, 5, p2ptest.Options{})
	trainers := sw.Nodes[1:]
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok := true
		for _, n := range trainers {
			pp := &P2PPeers{n: n}
			if len(pp.Members()) != len(trainers) {
				ok = false
			}
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("trainers do not see exactly the 4 volunteers")
		}
		time.Sleep(50 * time.Millisecond)
	}
	const P = 50_000
	rng := rand.New(rand.NewPCG(1, 2))
	phi0 := make([]float32, P)
	for i := range phi0 {
		phi0[i] = float32(rng.NormFloat64())
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ds := make([]*optimizer.DiLoCo, len(trainers))
	thetas := make([][]float32, len(trainers))
	for i, n := range trainers {
		pp, err := NewP2PPeers(n, p2p.ProtoReduce, 1<<22, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer pp.Close()
		bc := optimizer.DefaultButterflyConfig(P, nodeSigner{n}, butterflyTick.Seconds())
		var log *slog.Logger
		if os.Getenv("SKEIN_TEST_LOG") != "" {
			log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("trainer", i)
		}
		r, err := optimizer.NewButterflyDriver(pp, bc, optimizer.ButterflyOptions{Tick: butterflyTick, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		r.Start(ctx)
		defer r.Close()
		if ds[i], err = optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), r, phi0); err != nil {
			t.Fatal(err)
		}
		thetas[i] = append([]float32(nil), phi0...)
	}
	for round := 0; round < 3; round++ {
		var wg sync.WaitGroup
		errs := make([]error, len(trainers))
		for i := range trainers {
			for j := range thetas[i] {
				thetas[i][j] -= 0.01 * float32(i+1) * float32(j%5)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = ds[i].OuterStep(ctx, thetas[i])
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, trainer %d: %v", round, i, err)
			}
			if ds[i].StateHash() != ds[0].StateHash() {
				t.Fatalf("round %d: trainer %d disagrees", round, i)
			}
		}
	}
}

// TestInboxBudgets: a peer flooding the inbox fills only its own share;
// another peer's messages still get in, and draining frees the share.
func TestInboxBudgets(t *testing.T) {
	p := &P2PPeers{perPeer: 100, total: 250, queued: map[optimizer.PeerID]int64{}}
	for i := range 10 {
		if got, want := p.reserve("flood", 30), i < 3; got != want {
			t.Fatalf("flood message %d: reserved %v, want %v", i, got, want)
		}
	}
	if !p.reserve("honest", 100) {
		t.Fatal("the honest peer's message was refused during the flood")
	}
	if p.reserve("third", 100) {
		t.Fatal("past the total budget")
	}
	p.release("flood", 30)
	if !p.reserve("flood", 30) || p.reserve("flood", 11) {
		t.Fatal("the flood's share is not freed by draining, or not bounded after")
	}
	p.release("honest", 100)
	if p.queued["honest"] != 0 || p.queuedAll != 90 {
		t.Fatalf("accounting: %v, total %d", p.queued, p.queuedAll)
	}
}
