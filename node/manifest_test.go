package node

import (
	"context"
	"crypto/ed25519"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
)

// Without a bootstrap, a newcomer takes the volunteers' manifest only when
// they agree: one hostile member cannot point it at another run's settings.
func TestAgreedManifest(t *testing.T) {
	honest := manifest.Default()
	forged := manifest.Default()
	forged.Model.Preset = "small"
	bad := errors.New("no answer")
	for _, c := range []struct {
		name    string
		answers []any // manifest.Manifest or error, one per volunteer
		want    *manifest.Manifest
	}{
		{"two agree", []any{honest, honest}, &honest},
		{"majority of three", []any{honest, forged, honest}, &honest},
		{"one against one", []any{honest, forged}, nil},
		{"one of two answers", []any{honest, bad}, nil},
		{"the only volunteer", []any{honest}, &honest},
		{"forged majority needs two", []any{forged, bad, bad}, nil},
		{"nobody answers", []any{bad, bad}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var vols []peer.ID
			answers := map[peer.ID]any{}
			for i, a := range c.answers {
				id := peer.ID(rune('a' + i))
				vols = append(vols, id)
				answers[id] = a
			}
			ask := func(id peer.ID) (manifest.Manifest, error) {
				if m, ok := answers[id].(manifest.Manifest); ok {
					return m, nil
				}
				return manifest.Manifest{}, answers[id].(error)
			}
			got, err := agreedManifest(vols, ask, slog.New(slog.DiscardHandler))
			switch {
			case c.want == nil && err == nil:
				t.Fatalf("took manifest %s, want a refusal", got.ShortHash())
			case c.want != nil && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != nil && got.Hash() != c.want.Hash():
				t.Fatalf("took %s, want %s", got.ShortHash(), c.want.ShortHash())
			case err != nil && !errors.Is(err, ErrManifest):
				t.Fatalf("error %v is not ErrManifest", err)
			}
		})
	}
}

// The policy a volunteer was let in under must be the manifest's: a member
// that admits everyone into a run its manifest says is closed (or with
// another run key) is not running that run. Caps are each member's own.
func TestAdmissionAgrees(t *testing.T) {
	pub1, _, _ := ed25519.GenerateKey(nil)
	pub2, _, _ := ed25519.GenerateKey(nil)
	open := manifest.Default()
	closed := manifest.Default()
	closed.Admission.Mode, closed.Admission.RunKey = manifest.AdmissionClosed, p2p.EncodeRunKey(pub1)
	tests := []struct {
		name    string
		learned p2p.Admission
		m       manifest.Manifest
		ok      bool
	}{
		{"open as the manifest says", open.Admission.Policy(), open, true},
		{"closed with the manifest's key", closed.Admission.Policy(), closed, true},
		{"open, manifest closed", open.Admission.Policy(), closed, false},
		{"closed, manifest open", closed.Admission.Policy(), open, false},
		{"another run key", p2p.Admission{Closed: true, RunKey: pub2, MaxMembers: closed.Admission.MaxMembers}, closed, false},
		{"other caps", p2p.Admission{MaxMembers: open.Admission.MaxMembers + 1}, open, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := admissionAgrees(tt.learned, tt.m)
			if tt.ok != (err == nil) || (err != nil && !errors.Is(err, ErrManifest)) {
				t.Fatalf("err %v, want ok=%v (ErrManifest otherwise)", err, tt.ok)
			}
		})
	}
}

// Self-declared bootstrap (issue 18): a member that signs role bootstrap
// is not the run's bootstrap. A newcomer takes the manifest of the seed it
// dialled; the impostor's is one volunteer's word, and one honest volunteer
// disagrees, so while the seed is silent the newcomer takes nothing.
func TestManifestOnlyFromTheDialledBootstrap(t *testing.T) {
	s := p2ptest.NewSwarm(t, 4, p2ptest.Options{
		Node: func(i int, c *p2p.NodeConfig) {
			if i == 2 {
				c.Meta.Role = p2p.RoleBootstrap // the impostor
			}
		},
	})
	honest, forged := manifest.Default(), manifest.Default()
	honest.RunID, forged.RunID = s.Opts.RunID, s.Opts.RunID
	forged.Model.Preset = "small"
	for i, m := range map[int]manifest.Manifest{1: honest, 2: forged} {
		if err := ServeManifest(s.Nodes[i], m); err != nil {
			t.Fatal(err)
		}
	}
	newcomer := s.Nodes[3]
	ctx, cancel := context.WithTimeout(context.Background(), p2ptest.Slowdown*time.Minute)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	if m, err := FetchManifest(ctx, newcomer, s.Opts.RunID, time.Second, log); err == nil || m.Hash() == forged.Hash() {
		t.Fatalf("took manifest %s (%v) while the seed serves none; the impostor's is %s", m.ShortHash(), err, forged.ShortHash())
	}
	if err := ServeManifest(s.Seed.Node, honest); err != nil {
		t.Fatal(err)
	}
	if m, err := FetchManifest(ctx, newcomer, s.Opts.RunID, time.Second, log); err != nil || m.Hash() != honest.Hash() {
		t.Fatalf("took manifest %s (%v), want the seed's %s", m.ShortHash(), err, honest.ShortHash())
	}
}

// A volunteer refuses a run whose tokenizer it has with another vocabulary.
func TestCheckTokenizer(t *testing.T) {
	m := manifest.Default()
	if err := checkTokenizer(m); err != nil {
		t.Fatalf("byte: %v", err)
	}
	m.Data.Tokenizer = "gpt2"
	if err := checkTokenizer(m); err != nil {
		t.Fatalf("gpt2 without a hash: %v", err)
	}
	m.Data.TokenizerHash = data.GPT2VocabHash
	if err := checkTokenizer(m); err != nil {
		t.Fatalf("gpt2 with its hash: %v", err)
	}
	m.Data.TokenizerHash = strings.Repeat("0", 64)
	if err := checkTokenizer(m); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "tokenizer_hash") {
		t.Fatalf("another vocabulary: %v", err)
	}
}
