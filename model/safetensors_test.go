package model

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
)

func writeST(t testing.TB, tensors []NamedTensor, meta map[string]string) []byte {
	var buf bytes.Buffer
	if err := WriteSafetensors(&buf, tensors, meta); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestSafetensorsRoundTripBitExact(t *testing.T) {
	weird := []float32{0, float32(math.Copysign(0, -1)), 1e-45, math.MaxFloat32, -3.25, float32(math.Inf(1)), float32(math.NaN())}
	in := []NamedTensor{{Name: "a", Shape: []int{7}, Data: weird}, {Name: "b", Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}}, {Name: "empty", Shape: []int{0, 4}, Data: nil}}
	raw := writeST(t, in, map[string]string{"k": "v"})
	if binary.LittleEndian.Uint64(raw)%8 != 0 {
		t.Errorf("header length not 8-aligned")
	}
	h, err := ReadSafetensorsHeader(bytes.NewReader(raw), int64(len(raw)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if h.Metadata["k"] != "v" {
		t.Errorf("metadata lost: %v", h.Metadata)
	}
	got := map[string][]float32{}
	for _, ti := range h.Tensors {
		dst := make([]float32, (ti.End-ti.Begin)/4)
		if err := h.ReadTensor(bytes.NewReader(raw), ti, dst); err != nil {
			t.Fatal(err)
		}
		got[ti.Name] = dst
	}
	for _, tt := range in {
		g := got[tt.Name]
		if len(g) != len(tt.Data) {
			t.Fatalf("%s: %d elements, want %d", tt.Name, len(g), len(tt.Data))
		}
		for i := range g {
			if math.Float32bits(g[i]) != math.Float32bits(tt.Data[i]) {
				t.Errorf("%s[%d]: bits %08x, want %08x", tt.Name, i, math.Float32bits(g[i]), math.Float32bits(tt.Data[i]))
			}
		}
	}
}

func TestSafetensorsRejectsBadFiles(t *testing.T) {
	good := writeST(t, []NamedTensor{{Name: "w", Shape: []int{2, 2}, Data: []float32{1, 2, 3, 4}}}, nil)
	header := func(js string) []byte {
		b := make([]byte, 8, 8+len(js)+16)
		binary.LittleEndian.PutUint64(b, uint64(len(js)))
		return append(append(b, js...), make([]byte, 16)...)
	}
	tests := []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrMalformed},
		{"short prefix", good[:5], ErrMalformed},
		{"truncated data", good[:len(good)-1], ErrMalformed},
		{"trailing bytes", append(append([]byte{}, good...), 0), ErrMalformed},
		{"huge header length", func() []byte { b := append([]byte{}, good...); binary.LittleEndian.PutUint64(b, 1<<62); return b }(), ErrTooLarge},
		{"header past end", func() []byte {
			b := append([]byte{}, good...)
			binary.LittleEndian.PutUint64(b, uint64(len(good)))
			return b
		}(), ErrMalformed},
		{"not json", header("{nope"), ErrMalformed},
		{"wrong dtype", header(`{"w":{"dtype":"F16","shape":[8],"data_offsets":[0,16]}}`), ErrMalformed},
		{"shape mismatch", header(`{"w":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}}`), ErrMalformed},
		{"offsets outside", header(`{"w":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}}`), ErrMalformed},
		{"negative dim", header(`{"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}}`), ErrMalformed},
		{"overflowing shape", header(`{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}}`), ErrMalformed},
		{"overlap", header(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`), ErrMalformed},
		{"bad metadata", header(`{"__metadata__":{"a":1}}`), ErrMalformed},
	}
	for _, tt := range tests {
		_, err := ReadSafetensorsHeader(bytes.NewReader(tt.data), int64(len(tt.data)), 0)
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, err, tt.want)
		}
	}
	if _, err := ReadSafetensorsHeader(bytes.NewReader(good), int64(len(good)), 8); !errors.Is(err, ErrTooLarge) {
		t.Errorf("data limit not enforced: %v", err)
	}
}

// FuzzCheckpoint feeds arbitrary bytes to the checkpoint decoder: it must
// return an error or a checkpoint whose buffers match its layout, never
// panic, and never allocate more than the input's size justifies.
func FuzzCheckpoint(f *testing.F) {
	c := Config{Name: "micro", Vocab: 5, PaddedVocab: 8, MaxT: 4, C: 4, Layers: 1, Heads: 2}
	for _, moments := range []bool{false, true} {
		n := c.NumParams()
		ck := &Checkpoint{Config: c, Spec: FullSpec(c), Step: 3, Params: make([]float32, n)}
		if moments {
			ck.M, ck.V = make([]float32, n), make([]float32, n)
		}
		path := filepath.Join(f.TempDir(), "seed.safetensors")
		if err := SaveCheckpoint(path, ck); err != nil {
			f.Fatal(err)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		ck, err := decodeCheckpoint(bytes.NewReader(raw), int64(len(raw)))
		if err != nil {
			return
		}
		if len(ck.Params)*4 > len(raw) {
			t.Fatalf("decoded %d parameters from %d bytes", len(ck.Params), len(raw))
		}
		if len(ck.Params) != ck.Config.NumParams() && ck.Spec == FullSpec(ck.Config) {
			t.Fatalf("decoded %d parameters, layout has %d", len(ck.Params), ck.Config.NumParams())
		}
	})
}
