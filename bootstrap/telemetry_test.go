package bootstrap

import (
	"testing"

	"github.com/skein-ml/skein/manifest"
)

// The history refuses reports of more tokens than a member can train in a
// round of the run's manifest.
func TestStoreConfigBoundsTokens(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*manifest.Manifest)
		want uint64
	}{
		{"data parallel", func(m *manifest.Manifest) { m.Model.Batch, m.Model.SeqLen, m.Optimizer.InnerSteps = 8, 32, 50 }, 50 * 8 * 32},
		{"staged", func(m *manifest.Manifest) {
			m.Model.Batch, m.Model.SeqLen, m.Optimizer.InnerSteps = 4, 16, 10
			m.Pipeline.Stages, m.Pipeline.Microbatches = 3, 6
		}, 10 * 6 * 4 * 16},
	} {
		m := manifest.Default()
		c.edit(&m)
		if got := storeConfig(m).MaxRoundTokens; got != c.want {
			t.Errorf("%s: %d tokens a round, want %d", c.name, got, c.want)
		}
	}
}
