package manifest

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// FuzzParse: Parse never panics, and whatever it accepts re-encodes, within
// MaxSize, to canonical bytes that parse to the same manifest and hash.
func FuzzParse(f *testing.F) {
	run, err := os.ReadFile(filepath.Join("testdata", "run.toml"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(run)
	f.Add(Default().Canonical())
	f.Add(full().Canonical())
	for _, s := range []string{
		"",
		"run_id = \"r\"\n[optimizer]\nkind = \"noloco\"\n",
		"model = { preset = \"small\", seq_len = 0x40 }\noptimizer.inner_lr = 1e-3\n",
		"[optimizer]\ngrad_clip = -0.0\nouter_lr = inf\n",
		"[model]\nseed = -1\n",
		"[[data.shards]]\nhash = \"00\"\n",
		"RUN_ID = 'x'\n",
		"created = \"2025-06-01T12:00:00Z\"\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := Parse(in)
		if err != nil {
			return
		}
		c := m.Canonical()
		if len(c) > MaxSize {
			t.Fatalf("accepted manifest encodes to %d bytes", len(c))
		}
		m2, err := Parse(c)
		if err != nil {
			t.Fatalf("canonical bytes refused: %v\n%s", err, c)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip changed the manifest:\n%+v\n%+v", m, m2)
		}
		if !bytes.Equal(m2.Canonical(), c) || m2.Hash() != m.Hash() {
			t.Fatalf("canonical bytes not stable:\n%s\n%s", c, m2.Canonical())
		}
	})
}
