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

	"github.com/skein-ml/skein/internal/atomicfile"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/p2p"
)

// ErrManifest is returned (wrapped) when no usable manifest can be had, or
// the run's manifest is not the one this volunteer was given or had before.
var ErrManifest = errors.New("node: run manifest")

// ErrStagedRun is returned (wrapped) when the run's manifest splits the
// model into pipeline stages, which volunteers do not run yet.
var ErrStagedRun = errors.New("node: staged run")

// manifestFile is the copy kept in the data directory.
const manifestFile = "run.toml"

// ServeManifest answers manifest requests on n with m.
func ServeManifest(n *p2p.Node, m manifest.Manifest) error {
	b := m.Canonical()
	return n.Handle(p2p.ProtoManifest, p2p.MessageFrameConfig(manifest.MaxSize), func(_ context.Context, s *p2p.Stream) error {
		return s.WriteFrame(manifest.FrameType, b)
	})
}

// FetchManifest asks the run's members for its manifest until one source
// it can trust serves a valid one for runID, or wait runs out, or ctx ends
// (members that have just joined may not serve it yet, so it asks again
// every second). The answer of a bootstrap this node dialled (its
// configured seeds, p2p.Node.Seeds) is taken as the run's; a member that
// only claims the bootstrap role is one volunteer among the others. While
// no such bootstrap is a member (it is down, or this node joined through its
// peer book), or none has answered when wait runs out, the other members
// are asked instead, and their manifest is taken only when those that
// answer agree on it, at least two of them when there are two or more: one
// member alone cannot point newcomers at another run's data or settings.
func FetchManifest(ctx context.Context, n *p2p.Node, runID string, wait time.Duration, log *slog.Logger) (manifest.Manifest, error) {
	deadline := time.Now().Add(wait)
	var lastErr error = fmt.Errorf("%w: no member of run %q to ask", ErrManifest, runID)
	ask := func(id peer.ID) (manifest.Manifest, error) {
		m, err := fetchManifestFrom(ctx, n, id)
		if err == nil && m.RunID != runID {
			err = fmt.Errorf("%w: %s serves the manifest of run %q, not %q", ErrManifest, id, m.RunID, runID)
		}
		if err != nil {
			log.Debug("manifest", "peer", id, "err", err)
			lastErr = err
		}
		return m, err
	}
	for {
		boots, vols := memberSources(n)
		for _, id := range boots {
			if m, err := ask(id); err == nil {
				return m, nil
			}
		}
		late := time.Now().After(deadline)
		if len(vols) > 0 && (len(boots) == 0 || late) {
			m, err := agreedManifest(vols, ask, log)
			if err == nil {
				return m, nil
			}
			lastErr = err
		}
		if late {
			return manifest.Manifest{}, lastErr
		}
		select {
		case <-ctx.Done():
			return manifest.Manifest{}, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// maxManifestVoters bounds how many volunteers a newcomer asks.
const maxManifestVoters = 5

// agreedManifest asks up to maxManifestVoters volunteers and returns the
// manifest that a strict majority of those that answered serve, provided
// at least two answered (or the only volunteer there is did).
func agreedManifest(vols []peer.ID, ask func(peer.ID) (manifest.Manifest, error), log *slog.Logger) (manifest.Manifest, error) {
	votes := map[[32]byte]int{}
	byHash := map[[32]byte]manifest.Manifest{}
	answered := 0
	for _, id := range vols[:min(len(vols), maxManifestVoters)] {
		m, err := ask(id)
		if err != nil {
			continue
		}
		h := m.Hash()
		votes[h]++
		byHash[h] = m
		answered++
	}
	need := 2
	if len(vols) == 1 {
		need = 1
	}
	for h, k := range votes {
		if k >= need && 2*k > answered {
			if need == 1 {
				log.Warn("the bootstrap is unreachable and one volunteer serves the manifest; it could not be cross-checked")
			}
			return byHash[h], nil
		}
	}
	return manifest.Manifest{}, fmt.Errorf("%w: no bootstrap answered and %d volunteers answered with %d different manifests (need %d agreeing)",
		ErrManifest, answered, len(votes), need)
}

// memberSources lists the members other than self that serve the manifest
// and the shards: the bootstraps this node dialled (which have both from
// the start; a member's role is its own word, so never taken from it), then
// the others, sorted.
func memberSources(n *p2p.Node) (boots, vols []peer.ID) {
	seeds := n.Seeds()
	for _, m := range n.Members() {
		switch {
		case m.ID == n.ID():
		case slices.Contains(seeds, m.ID):
			boots = append(boots, m.ID)
		default:
			vols = append(vols, m.ID)
		}
	}
	slices.Sort(vols)
	return boots, vols
}

func fetchManifestFrom(ctx context.Context, n *p2p.Node, id peer.ID) (manifest.Manifest, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	s, err := n.Open(ctx, id, p2p.ProtoManifest, p2p.MessageFrameConfig(manifest.MaxSize))
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
		return manifest.Manifest{}, fmt.Errorf("%w: from %s: %w", ErrManifest, id, err)
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
