package p2p_test

import (
	"context"
	"errors"
	"testing"

	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
)

// A volunteer needs only the bootstrap's address: the run id is learned
// from the protocols the bootstrap serves.
func TestDiscoverRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p seed")
	}
	sw := p2ptest.NewSwarm(t, 1, p2ptest.Options{RunID: "discover-me"})
	run, err := p2p.DiscoverRun(context.Background(), []string{"/ip4/127.0.0.1/udp/9/quic-v1/p2p/12D3KooWHGr3gLQADoFvneeDwLbcdTzShdqRFdw8hUypthwHXD1Y",
		sw.Seed.FullAddr().String()}, nil)
	if err != nil || run != "discover-me" {
		t.Fatalf("run %q, %v; want discover-me", run, err)
	}
	if _, err := p2p.DiscoverRun(context.Background(), nil, nil); !errors.Is(err, p2p.ErrNoSeed) {
		t.Fatalf("no address: %v, want ErrNoSeed", err)
	}
}
