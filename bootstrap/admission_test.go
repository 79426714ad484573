package bootstrap

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/p2p"
)

// closedConfig is a closed run's bootstrap config under a new run key.
func closedConfig(t *testing.T) (Config, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig(t.TempDir())
	cfg.Manifest = manifest.Default()
	cfg.Manifest.RunID = "closed-test"
	cfg.Manifest.Admission.Mode, cfg.Manifest.Admission.RunKey = manifest.AdmissionClosed, p2p.EncodeRunKey(pub)
	cfg.Listen, cfg.Timing = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}, p2p.FastTiming()
	return cfg, priv
}

// A closed run's bootstrap without a token or the run key does not start,
// and says how to get a token for its peer ID; one given a key that is not
// the run's is refused too.
func TestClosedRunBootstrapNeedsToken(t *testing.T) {
	cfg, _ := closedConfig(t)
	err := Run(context.Background(), cfg)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "skein token issue") || !strings.Contains(err.Error(), "--role bootstrap") {
		t.Fatalf("no token: %v", err)
	}
	t.Log(err)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	cfg.RunKey = other
	if err := Run(context.Background(), cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "not the one admission.run_key names") {
		t.Fatalf("another key: %v", err)
	}
}

// A closed run's bootstrap holding the run key admits a volunteer with a
// token and refuses one without.
func TestClosedRunBootstrap(t *testing.T) {
	cfg, runKey := closedConfig(t)
	cfg.RunKey = runKey
	ready := make(chan Info, 1)
	cfg.Ready = func(i Info) { ready <- i }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	var info Info
	select {
	case info = <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("bootstrap not ready after 30 s")
	}
	join := func(token func(peer.ID) []byte) (*p2p.Node, error) {
		key, _, _ := crypto.GenerateEd25519Key(rand.Reader)
		id, _ := peer.IDFromPrivateKey(key)
		nc := p2p.DefaultNodeConfig(info.Manifest.RunID)
		nc.Bootstrap, nc.ListenAddrs, nc.Timing = info.Addrs[:1], []string{"/ip4/127.0.0.1/udp/0/quic-v1"}, p2p.FastTiming()
		nc.Identity, nc.Token = key, token(id)
		n, err := p2p.NewNode(context.Background(), nc)
		if err == nil {
			t.Cleanup(func() { n.Close() })
		}
		return n, err
	}
	if _, err := join(func(peer.ID) []byte { return nil }); !errors.Is(err, p2p.ErrTokenMissing) {
		t.Fatalf("volunteer without a token: %v", err)
	}
	n, err := join(func(id peer.ID) []byte {
		b, err := p2p.IssueToken(runKey, p2p.Token{Peer: id, RunID: info.Manifest.RunID, Role: p2p.RoleVolunteer, Expires: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
	if err != nil {
		t.Fatalf("volunteer with a token: %v", err)
	}
	// It is a member, and is served the manifest (a gated protocol).
	if _, err := fetchManifest(n, info); err != nil {
		t.Fatalf("manifest: %v", err)
	}
}

func fetchManifest(n *p2p.Node, info Info) ([]byte, error) {
	id, err := peer.Decode(info.PeerID)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := n.Open(ctx, id, p2p.ProtoManifest, p2p.MessageFrameConfig(manifest.MaxSize))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	_, b, err := s.ReadFrame()
	return b, err
}
