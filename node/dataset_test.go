package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skein-ml/skein/bootstrap"
	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/p2p/p2ptest"
)

// cachedBytes is what a volunteer's chunk cache holds.
func cachedBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	ents, _ := os.ReadDir(filepath.Join(dir, datasetDir))
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && !e.IsDir() {
			n += fi.Size()
		}
	}
	return n
}

// TestDatasetVolunteers runs DiLoCo volunteers over a packed dataset
// served by a real bootstrap, over libp2p on loopback: each fetches only
// the chunks of its blocks (a small share of the dataset), they end every
// round with the same state (the data ledger included, in the state
// hash), the ledger counts one block per member of each round's group,
// and a late joiner takes the ledger with the state and agrees with them.
func TestDatasetVolunteers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a bootstrap and three volunteers over libp2p")
	}
	m, root := smallRun(t, "dataset-test")
	m.Optimizer.InnerSteps = 4
	m.Data.Source = manifest.SourceDataset
	ds := t.TempDir()
	sum, err := data.PackDataset(context.Background(), ds, []string{filepath.Join(root, "src", "strings"), filepath.Join(root, "src", "bufio")},
		data.PackConfig{Tokenizer: data.ByteTokenizer{}, ChunkTokens: 2048, ShardTokens: 1 << 17, ValFraction: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, sh := range append(sum.Dataset.Train, sum.Dataset.Validation...) {
		total += sh.Bytes
	}
	ctx, cancel := context.WithTimeout(context.Background(), p2ptest.Slowdown*3*time.Minute)
	defer cancel()
	info, bout := startBootstrap(ctx, t, bootstrap.Config{Manifest: m, Dataset: ds, Logger: testLogger("bootstrap")})
	if !strings.Contains(bout.String(), "serving dataset") || info.Manifest.Data.Source != manifest.SourceDataset ||
		len(info.Manifest.Data.Shards) != len(sum.Dataset.Train)+len(sum.Dataset.Validation) {
		t.Fatalf("bootstrap does not serve the dataset (%d shards listed):\n%s", len(info.Manifest.Data.Shards), bout.String())
	}
	r := &nolocoRun{t: t, m: info.Manifest, addr: info.Addrs[0], ctx: ctx}
	var vols []*testVolunteer
	for _, name := range []string{"a", "b"} {
		vols = append(vols, r.join(name, "", 0, 2, nil)) // until stopped
	}
	long := p2ptest.Slowdown * 2 * time.Minute
	r.until("two rounds", long, func() bool {
		for _, tv := range vols {
			select {
			case err := <-tv.done:
				t.Fatalf("%s ended early: %v\n%s", tv.name, err, tv.output())
			default:
			}
		}
		return vols[0].lastRound() >= 2 && vols[1].lastRound() >= 2
	}, vols...)
	late := r.join("late", "", 2, 2, nil)
	if err := r.wait(late, long); err != nil {
		t.Fatalf("%v\n%s", err, late.output())
	}
	vols[0].cancel()
	if err := r.wait(vols[0], long); err != nil {
		t.Fatalf("%v\n%s", err, vols[0].output())
	}
	vols[1].cancel()
	if err := r.wait(vols[1], long); err != nil {
		t.Fatalf("%v\n%s", err, vols[1].output())
	}
	vols = append(vols, late)
	// The same state after every round any two of them reported.
	hashes := map[uint64]uint64{}
	for _, tv := range vols {
		for _, rep := range tv.reports() {
			if h, ok := hashes[rep.Round]; ok && h != rep.StateHash {
				for _, o := range vols {
					t.Logf("--- %s:\n%s", o.name, o.output())
				}
				t.Fatalf("%s: round %d state %016x, another volunteer's %016x", tv.name, rep.Round, rep.StateHash, h)
			}
			hashes[rep.Round] = rep.StateHash
			if rep.Data == nil {
				t.Fatalf("%s: round %d reports no data progress", tv.name, rep.Round)
			}
		}
	}
	// The ledger counted the blocks of each round's group: two or three a
	// round, every one trained once.
	a := vols[0].reports()
	last := a[len(a)-1]
	blocksPerEpoch, _ := data.NewBlocks(sum.Tokens[data.Train], 32, 4*2, m.Model.Seed)
	trained := uint64(last.Data.Trained*float64(blocksPerEpoch.N) + 0.5)
	if trained < 2*last.Round || trained > 3*last.Round {
		t.Fatalf("after round %d the ledger counts %d blocks trained\n%s", last.Round, trained, vols[0].output())
	}
	// No block trained twice, except (rarely, by design) by two members in
	// their first round, when neither was in the ledger's group.
	type trainer struct {
		name  string
		first bool
	}
	blocks := map[uint64]trainer{}
	for _, tv := range vols {
		first := true
		for _, rep := range tv.reports() {
			if rep.Adopted {
				continue
			}
			if o, dup := blocks[rep.Data.Block]; dup && !(o.first && first) {
				t.Fatalf("block %d trained by %s and %s", rep.Data.Block, o.name, tv.name)
			}
			blocks[rep.Data.Block] = trainer{tv.name, first}
			first = false
		}
	}
	// Each fetched a small share of the dataset.
	for _, tv := range vols {
		if got := cachedBytes(t, tv.dir); got == 0 || got > total/4 {
			t.Fatalf("%s cached %d bytes of a %d-byte dataset\n%s", tv.name, got, total, tv.output())
		}
	}

	// NoLoCo on the dataset: each member takes the block at its rank among
	// the volunteers it sees, so two members that see each other train
	// disjoint blocks in every phase.
	r.t.Run("noloco", func(t *testing.T) {
		m := info.Manifest
		m.RunID = "dataset-noloco"
		o := &m.Optimizer
		o.Kind, o.InnerLR, o.Warmup, o.TotalSteps = manifest.KindNoLoCo, 2e-3, 8, 1000
		o.OuterLR, o.OuterMomentum, o.GroupSize, o.Gamma = 0.7, 0.5, 2, 0.7
		info, _ := startBootstrap(ctx, t, bootstrap.Config{Manifest: m, Dataset: ds, Logger: testLogger("bootstrap")})
		r := &nolocoRun{t: t, m: info.Manifest, addr: info.Addrs[0], ctx: ctx}
		a, b := r.join("a", "", 4, 2, nil), r.join("b", "", 4, 2, nil)
		byRound := map[uint64]map[uint64]string{}
		for _, tv := range []*testVolunteer{a, b} {
			if err := r.wait(tv, long); err != nil {
				t.Fatalf("%v\n%s", err, tv.output())
			}
			for _, rep := range tv.reports() {
				if rep.Adopted || rep.Data == nil {
					continue
				}
				if byRound[rep.Round] == nil {
					byRound[rep.Round] = map[uint64]string{}
				}
				if o, dup := byRound[rep.Round][rep.Data.Block]; dup {
					t.Fatalf("step %d: %s and %s trained block %d\n%s\n%s", rep.Round, o, tv.name, rep.Data.Block, a.output(), b.output())
				}
				byRound[rep.Round][rep.Data.Block] = tv.name
			}
		}
		if len(byRound) < 3 {
			t.Fatalf("%d steps with data reports\n%s", len(byRound), a.output())
		}
	})

	// A run that ends after a number of tokens: the volunteers leave by
	// themselves once the ledger has counted them.
	r.t.Run("max_tokens", func(t *testing.T) {
		m := info.Manifest
		m.RunID = "dataset-end"
		m.Data.MaxTokens = 5 * blocksPerEpoch.BlockTokens() // three rounds of two members
		info, _ := startBootstrap(ctx, t, bootstrap.Config{Manifest: m, Dataset: ds, Logger: testLogger("bootstrap")})
		r := &nolocoRun{t: t, m: info.Manifest, addr: info.Addrs[0], ctx: ctx}
		a, b := r.join("a", "", 0, 2, nil), r.join("b", "", 0, 2, nil)
		for _, tv := range []*testVolunteer{a, b} {
			if err := r.wait(tv, long); err != nil {
				t.Fatalf("%v\n%s", err, tv.output())
			}
			if !strings.Contains(tv.output(), "the run is complete") || tv.lastRound() != 3 {
				t.Fatalf("%s did not end the run after 3 rounds:\n%s", tv.name, tv.output())
			}
		}
	})
}
