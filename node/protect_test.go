package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
	"github.com/skein-ml/skein/replica"
	"github.com/skein-ml/skein/trainer"
)

// A non-finite loss in the middle of a run (the weights poisoned once,
// before an inner step of the second round) does not stop the volunteer:
// it drops the phase, goes back to phi, trains its rounds and leaves a
// finite checkpoint. The stale temporary file a crash left in its data
// directory is gone.
func TestVolunteerSurvivesNonFiniteLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a volunteer over libp2p")
	}
	for _, kind := range []string{manifest.KindDiLoCo, manifest.KindNoLoCo} {
		t.Run(kind, func(t *testing.T) {
			r := newNoLoCoRun(t, func(m *manifest.Manifest) {
				m.RunID, m.Optimizer.Kind = kind+"-poison-test", kind
			})
			dir := t.TempDir()
			stale := filepath.Join(dir, ".volunteer.safetensors.4242.tmp")
			os.WriteFile(stale, []byte("half a checkpoint"), 0o644)
			old := time.Now().Add(-time.Hour)
			os.Chtimes(stale, old, old)

			poisoned := false
			poison := func(c *VolunteerConfig) {
				c.beforeStep = func(su *trainer.Setup, step int) {
					if step != 5 || poisoned { // the second step of round 2
						return
					}
					poisoned = true
					p := make([]float32, su.Stage.NumParams())
					su.Dev.CopyOut(p, su.Stage.Params)
					for i := range p {
						p[i] = float32(math.NaN())
					}
					su.Dev.CopyIn(su.Stage.Params, p)
				}
			}
			const want = 3
			tv := r.join("a", dir, want, 1, nil, poison)
			if err := r.wait(tv, p2ptest.Slowdown*60*time.Second); err != nil {
				t.Fatalf("volunteer stopped: %v\n%s", err, tv.output())
			}
			out := tv.output()
			if !poisoned || !regexp.MustCompile(`warning: round 2: .*non-finite.*dropped the inner phase`).MatchString(out) {
				t.Fatalf("poisoned %v; no warning naming round 2 in:\n%s", poisoned, out)
			}
			reps := tv.reports()
			if len(reps) == 0 || reps[len(reps)-1].Round < want {
				t.Fatalf("rounds %v, want up to %d\n%s", rounds(reps), want, out)
			}
			for _, rep := range reps {
				if math.IsNaN(float64(rep.Loss)) || math.IsInf(float64(rep.Loss), 0) {
					t.Fatalf("round %d reported loss %v\n%s", rep.Round, rep.Loss, out)
				}
			}
			ckPath := filepath.Join(dir, volunteerCheckpoint)
			ck, err := model.LoadCheckpoint(ckPath)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range [][]float32{ck.Params, ck.M, ck.V} {
				if i := nonFinite(x); i >= 0 {
					t.Fatalf("checkpoint holds %v at %d", x[i], i)
				}
			}
			raw, err := os.ReadFile(ckPath + ".state")
			if err != nil {
				t.Fatal(err)
			}
			if _, _, _, err := decodeState(raw, len(ck.Params)); err != nil {
				t.Fatalf("saved outer state: %v", err)
			}
			if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("stale temporary file kept: %v", err)
			}
		})
	}
}

// testStage is a one-layer tiny model's stage.
func testStage(t *testing.T) *model.Stage {
	t.Helper()
	cfg, err := model.Preset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Layers = 1
	s, err := model.NewStage(kernels.NewCPU(1), cfg, model.FullSpec(cfg), 1, 8, 7)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// saveState refuses non-finite weights, moments or outer state, and the
// checkpoint already on disk stays as it was.
func TestSaveStateRefusesNonFinite(t *testing.T) {
	st := testStage(t)
	n := st.NumParams()
	dl, err := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, make([]float32, n))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), volunteerCheckpoint)
	if err := saveState(path, st, 3, dl); err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(path)
	goodState, _ := os.ReadFile(path + ".state")
	poison := func(b kernels.Buffer) func() {
		return func() {
			x := make([]float32, b.Len())
			st.Device().CopyOut(x, b)
			x[len(x)/2] = float32(math.Inf(-1))
			st.Device().CopyIn(b, x)
		}
	}
	for name, spoil := range map[string]func(){
		"weights":  poison(st.Params),
		"moments":  poison(st.V),
		"phi":      func() { dl.Phi[1] = float32(math.NaN()) },
		"momentum": func() { dl.Mom[2] = float32(math.NaN()) },
	} {
		t.Run(name, func(t *testing.T) {
			st.Init(7)
			clear(dl.Phi)
			clear(dl.Mom)
			spoil()
			dl.Touch()
			if err := saveState(path, st, 4, dl); !errors.Is(err, trainer.ErrNonFinite) {
				t.Fatalf("got %v, want trainer.ErrNonFinite", err)
			}
			now, _ := os.ReadFile(path)
			nowState, _ := os.ReadFile(path + ".state")
			if !bytes.Equal(now, good) || !bytes.Equal(nowState, goodState) {
				t.Fatal("the good checkpoint was overwritten")
			}
		})
	}
}

// An unusable local checkpoint is moved aside, with a warning naming both
// paths, never resumed and never left to be overwritten.
func TestCorruptCheckpointMovedAside(t *testing.T) {
	st := testStage(t)
	n := st.NumParams()
	dl, err := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, make([]float32, n))
	if err != nil {
		t.Fatal(err)
	}
	save := func(dir string) string {
		path := filepath.Join(dir, volunteerCheckpoint)
		if err := saveState(path, st, 3, dl); err != nil {
			t.Fatal(err)
		}
		return path
	}
	flip := func(p string) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0xff
		os.WriteFile(p, b, 0o644)
	}
	nanWeights := func(p string) {
		ck, err := model.LoadCheckpoint(p)
		if err != nil {
			t.Fatal(err)
		}
		ck.Params[0] = float32(math.NaN())
		if err := model.SaveCheckpoint(p, ck); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name  string
		spoil func(path string)
		moved []string // suffixes of the files moved aside
	}{
		{"state damaged", func(p string) { flip(p + ".state") }, []string{"", ".state"}},
		{"checkpoint truncated", func(p string) { os.Truncate(p, 100) }, []string{"", ".state"}},
		{"checkpoint missing", func(p string) { os.Remove(p) }, []string{".state"}},
		{"state missing", func(p string) { os.Remove(p + ".state") }, []string{""}},
		{"weights not finite", nanWeights, []string{"", ".state"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := save(dir)
			tt.spoil(path)
			var out bytes.Buffer
			v := &Volunteer{cfg: VolunteerConfig{DataDir: dir, Progress: &out}, log: testLogger("v"),
				su: &trainer.Setup{Stage: st}}
			if v.resumeLocal(dl) {
				t.Fatal("resumed an unusable checkpoint")
			}
			for _, suf := range tt.moved {
				p := path + suf
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s still in place: %v", p, err)
				}
				aside, _ := filepath.Glob(p + ".corrupt-*")
				if len(aside) != 1 {
					t.Fatalf("%s moved to %v, want one .corrupt-<time> file", p, aside)
				}
				if !regexp.MustCompile(`\.corrupt-\d{8}T\d{6}Z$`).MatchString(aside[0]) {
					t.Errorf("moved to %s, want a UTC timestamp", aside[0])
				}
				if !strings.Contains(out.String(), p+" is unusable") || !strings.Contains(out.String(), "moved it to "+aside[0]) {
					t.Errorf("warning does not name %s and %s:\n%s", p, aside[0], out.String())
				}
			}
		})
	}
	// No checkpoint at all: nothing to resume, nothing moved, no warning.
	var out bytes.Buffer
	dir := t.TempDir()
	v := &Volunteer{cfg: VolunteerConfig{DataDir: dir, Progress: &out}, log: testLogger("v"), su: &trainer.Setup{Stage: st}}
	if v.resumeLocal(dl) || out.Len() > 0 {
		t.Fatalf("fresh directory: %q", out.String())
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("fresh directory now holds %v", left)
	}
	// A good one resumes.
	save(dir)
	if !v.resumeLocal(dl) || v.innerStep != 3 {
		t.Fatalf("good checkpoint not resumed (inner step %d):\n%s", v.innerStep, out.String())
	}
}

// Every setting is checked, by its flag's name, before the network.
func TestVolunteerConfigValidate(t *testing.T) {
	corpus := filepath.Join(t.TempDir(), "corpus.txt")
	os.WriteFile(corpus, []byte("some text"), 0o644)
	file := filepath.Join(t.TempDir(), "a-file")
	os.WriteFile(file, nil, 0o644)
	const boot = "/ip4/127.0.0.1/udp/4001/quic-v1/p2p/12D3KooWEyoppNCUx8Yx66oV9fJnriXwCcXwDDUA2kj6vnc6iDEp"
	for _, tt := range []struct {
		name string
		edit func(*VolunteerConfig)
		flag string // "" when valid
	}{
		{"valid", func(*VolunteerConfig) {}, ""},
		{"valid with everything", func(c *VolunteerConfig) {
			c.Corpus, c.MetricsAddr, c.DataDir, c.RunID = []string{corpus}, "127.0.0.1:9101", t.TempDir(), "run-1"
			c.Local = manifest.Local{Preset: "tiny", Batch: 8, SeqLen: 64, InnerSteps: 50, Codec: "fp32", Optimizer: "noloco"}
		}, ""},
		{"no bootstrap nor run", func(c *VolunteerConfig) { c.Bootstrap = nil }, "--bootstrap"},
		{"rejoin by run id", func(c *VolunteerConfig) { c.Bootstrap, c.RunID = nil, "run-1" }, ""},
		{"run id", func(c *VolunteerConfig) { c.RunID = "bad run!" }, "--run-id"},
		{"bootstrap without peer id", func(c *VolunteerConfig) { c.Bootstrap = []string{"/ip4/1.2.3.4/udp/1/quic-v1"} }, "--bootstrap"},
		{"listen", func(c *VolunteerConfig) { c.Listen = []string{"not-an-addr"} }, "--listen"},
		{"rounds", func(c *VolunteerConfig) { c.Rounds = -1 }, "--rounds"},
		{"min peers", func(c *VolunteerConfig) { c.MinPeers = 0 }, "--min-peers"},
		{"threads", func(c *VolunteerConfig) { c.Threads = -2 }, "--threads"},
		{"val batches", func(c *VolunteerConfig) { c.ValBatches = -1 }, "--val-batches"},
		{"metrics", func(c *VolunteerConfig) { c.MetricsAddr = "9101" }, "--metrics"},
		{"corpus missing", func(c *VolunteerConfig) { c.Corpus = []string{filepath.Join(t.TempDir(), "absent")} }, "--corpus"},
		{"data dir a file", func(c *VolunteerConfig) { c.DataDir = file }, "--data-dir"},
		{"timing", func(c *VolunteerConfig) { c.Timing.ProbeTimeout = 10 * c.Timing.ProbeInterval }, "--timing"},
		{"preset", func(c *VolunteerConfig) { c.Local.Preset = "huge" }, "--preset"},
		{"batch", func(c *VolunteerConfig) { c.Local.Batch = -8 }, "--batch"},
		{"seq len", func(c *VolunteerConfig) { c.Local.SeqLen = -1 }, "--seq-len"},
		{"inner steps", func(c *VolunteerConfig) { c.Local.InnerSteps = -5 }, "--inner-steps"},
		{"codec", func(c *VolunteerConfig) { c.Local.Codec = "zip" }, "--codec"},
		{"optimizer", func(c *VolunteerConfig) { c.Local.Optimizer = "adam" }, "--optimizer"},
		{"collective", func(c *VolunteerConfig) { c.Collective.MinDeadline = 0 }, "collective"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultVolunteerConfig("")
			c.Bootstrap = []string{boot}
			tt.edit(&c)
			err := c.Validate()
			switch {
			case tt.flag == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.flag != "" && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.flag)):
				t.Fatalf("got %v, want ErrConfig naming %s", err, tt.flag)
			}
		})
	}
}

// A bad flag fails before any network activity: NewVolunteer returns at
// once, with no bootstrap to reach, and the corpus is opened before joining.
func TestNewVolunteerChecksBeforeJoining(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Log("running as root: the unreadable-corpus case is skipped")
	}
	unreadable := filepath.Join(t.TempDir(), "secret")
	os.Mkdir(unreadable, 0)
	empty := t.TempDir() // a corpus with no files: opened, refused
	// Nothing listens here: any network activity would hang or fail otherwise.
	const boot = "/ip4/127.0.0.1/udp/9/quic-v1/p2p/12D3KooWEyoppNCUx8Yx66oV9fJnriXwCcXwDDUA2kj6vnc6iDEp"
	for name, edit := range map[string]func(*VolunteerConfig){
		"val batches":  func(c *VolunteerConfig) { c.ValBatches = -1 },
		"empty corpus": func(c *VolunteerConfig) { c.Corpus = []string{empty} },
		"unreadable corpus": func(c *VolunteerConfig) {
			if os.Geteuid() == 0 {
				c.Corpus = []string{filepath.Join(unreadable, "absent")}
			} else {
				c.Corpus = []string{unreadable}
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := DefaultVolunteerConfig("")
			c.Bootstrap, c.DataDir = []string{boot}, t.TempDir()
			edit(&c)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			began := time.Now()
			_, err := NewVolunteer(ctx, c)
			if !errors.Is(err, ErrConfig) || time.Since(began) > 2*time.Second {
				t.Fatalf("got %v after %v, want ErrConfig at once", err, time.Since(began))
			}
			if _, err := os.Stat(filepath.Join(c.DataDir, p2p.IdentityFile)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("an identity was created before the settings were checked: %v", err)
			}
		})
	}
}

// A poisoned phi is not trained from: the volunteer takes the state the
// certificate of its round names and installs it; without a certificate
// it takes nothing (what most announce is no proof: sybils can be most).
func TestRollbackRetakesPoisonedPhi(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	sw := p2ptest.NewSwarm(t, 4, p2ptest.Options{})
	me, others := sw.Nodes[1], sw.Nodes[2:]
	ctx := context.Background()
	st := testStage(t)
	n := st.NumParams()
	phi := make([]float32, n)
	for i := range phi {
		phi[i] = float32(i%13) / 13
	}
	theirs, _ := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, phi)
	theirs.Round = 3
	blob, _ := encodeServed(theirs.State())
	for _, o := range others {
		// A broadcast not acknowledged in time (a loaded machine) still
		// spreads by gossip: the wait below is what counts.
		if err := o.UpdateMeta(ctx, func(m *p2p.Meta) { m.Round, m.StateHash = 3, theirs.StateHash() }); err != nil {
			t.Logf("announcing: %v", err)
		}
		o.ServeBulk(func(context.Context, peer.ID, string) (io.ReaderAt, int64, error) {
			return bytes.NewReader(blob), int64(len(blob)), nil
		}, 0)
	}
	mine, _ := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, make([]float32, n))
	mine.Round = 3
	mine.Phi[7] = float32(math.NaN()) // as if an outer step had overflowed
	mine.Touch()
	var out bytes.Buffer
	v := &Volunteer{cfg: VolunteerConfig{Progress: &out}, log: testLogger("v"), pn: me, dl: mine, n: n,
		theta: make([]float32, n), su: &trainer.Setup{Stage: st, Dev: st.Device()}}
	v.outer = dilocoLoop{v}
	// Without a certificate of round 3, nothing is taken.
	if err := v.rollbackDiLoCo(ctx); err == nil || !strings.Contains(err.Error(), "no certificate") {
		t.Fatalf("rolled back without a certificate: %v", err)
	}
	cert := &replica.Certificate{Run: me.RunID(), Round: 3, Hash: theirs.StateHash()}
	var err error
	if v.certs, err = newCerts(me, v.log, cert, "", nil); err != nil {
		t.Fatal(err)
	}
	defer v.certs.close()
	deadline := time.Now().Add(p2ptest.Slowdown * 10 * time.Second)
	for len(holders(cert, announcements(me))) < len(others) {
		if time.Now().After(deadline) {
			t.Fatalf("the others' announcements did not arrive: %v", holders(cert, announcements(me)))
		}
		time.Sleep(50 * time.Millisecond)
	}
	v.rollback(ctx, fmt.Errorf("%w: step 9: loss NaN", trainer.ErrNonFinite))
	if mine.StateHash() != theirs.StateHash() {
		t.Fatalf("phi not replaced by the run's state:\n%s", out.String())
	}
	w := make([]float32, n)
	st.Device().CopyOut(w, st.Params)
	if !slices.Equal(w, phi) {
		t.Fatal("the run's phi is not the stage's weights")
	}
}
