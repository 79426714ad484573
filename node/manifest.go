package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/bootstrap/manifest"
	"github.com/skein-ml/skein/internal/atomicfile"
	"github.com/skein-ml/skein/p2p"
)

// ErrManifest is returned (wrapped) when no usable manifest can be had, or
// the run's manifest is not the one this volunteer was given or had before.
var ErrManifest = errors.New("node: run manifest")

// manifestFile is the copy kept in the data directory.
const manifestFile = "run.toml"

func manifestFrameConfig() p2p.FrameConfig {
	c := p2p.DefaultFrameConfig()
	c.MaxSize = manifest.MaxSize
	c.ReadTimeout, c.WriteTimeout = 10*time.Second, 10*time.Second
	return c
}

// ServeManifest answers manifest requests on n with m.
func ServeManifest(n *p2p.Node, m manifest.Manifest) error {
	b := m.Canonical()
	return n.Handle(p2p.ProtoManifest, manifestFrameConfig(), func(_ context.Context, s *p2p.Stream) error {
		return s.WriteFrame(manifest.FrameType, b)
	})
}

// FetchManifest asks the run's members for its manifest, the bootstrap
// first, until one serves a valid one for runID or ctx ends (members that
// have just joined may not serve it yet, so it keeps asking every second
// for up to wait).
func FetchManifest(ctx context.Context, n *p2p.Node, runID string, wait time.Duration, log *slog.Logger) (manifest.Manifest, error) {
	deadline := time.Now().Add(wait)
	var lastErr error = fmt.Errorf("%w: no member of run %q to ask", ErrManifest, runID)
	for {
		for _, id := range otherMembers(n) {
			m, err := fetchManifestFrom(ctx, n, id)
			if err == nil && m.RunID != runID {
				err = fmt.Errorf("%w: %s serves the manifest of run %q, not %q", ErrManifest, id, m.RunID, runID)
			}
			if err == nil {
				return m, nil
			}
			log.Debug("manifest", "peer", id, "err", err)
			lastErr = err
		}
		if time.Now().After(deadline) {
			return manifest.Manifest{}, lastErr
		}
		select {
		case <-ctx.Done():
			return manifest.Manifest{}, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// otherMembers lists the members other than self: bootstraps first (they
// have the manifest and every shard from the start), then the others.
func otherMembers(n *p2p.Node) []peer.ID {
	var boot, vols []peer.ID
	for _, m := range n.Members() {
		switch {
		case m.ID == n.ID():
		case m.Meta.Role == p2p.RoleBootstrap:
			boot = append(boot, m.ID)
		default:
			vols = append(vols, m.ID)
		}
	}
	slices.Sort(vols)
	return append(boot, vols...)
}

func fetchManifestFrom(ctx context.Context, n *p2p.Node, id peer.ID) (manifest.Manifest, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	s, err := n.Open(ctx, id, p2p.ProtoManifest, manifestFrameConfig())
	if err != nil {
		return manifest.Manifest{}, err
	}
	defer s.Close()
	typ, b, err := s.ReadFrame()
	if err != nil {
		s.Reset()
		return manifest.Manifest{}, err
	}
	if typ != manifest.FrameType {
		return manifest.Manifest{}, fmt.Errorf("%w: %s sent frame type %d", ErrManifest, id, typ)
	}
	m, err := manifest.Parse(b)
	if err != nil {
		return manifest.Manifest{}, fmt.Errorf("%w: from %s: %v", ErrManifest, id, err)
	}
	return m, nil
}

// loadCachedManifest returns the manifest this data directory last trained
// under, if any.
func loadCachedManifest(dataDir string) (*manifest.Manifest, error) {
	if dataDir == "" {
		return nil, nil
	}
	m, err := manifest.Load(filepath.Join(dataDir, manifestFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &m, nil
}

func saveManifest(dataDir string, m manifest.Manifest) error {
	if dataDir == "" {
		return nil
	}
	return atomicfile.WriteFile(filepath.Join(dataDir, manifestFile), m.Canonical(), 0o644)
}
