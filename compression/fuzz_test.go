package compression

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Fuzz targets, one per decoder. Seed corpora live in testdata/fuzz/<Target>;
// regenerate them with SKEIN_WRITE_FUZZ_CORPUS=1 go test -run TestWriteFuzzCorpus.

const fuzzMaxElems = 1 << 16

func checkDecoded(t *testing.T, y []float32) {
	for i, v := range y {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("decoded element %d is %v", i, v)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range fuzzFrames() {
		f.Add(s)
	}
	dec, _ := NewDecoder(Config{Workers: 2, MaxElements: fuzzMaxElems})
	dec1, _ := NewDecoder(Config{Workers: 1, MaxElements: fuzzMaxElems})
	f.Fuzz(func(t *testing.T, data []byte) {
		y, err := dec.DecodeBytes(data, nil)
		if err == nil {
			checkDecoded(t, y)
		}
		// Decoding from a stream on one worker, growing the output as chunks
		// arrive, agrees: the same frames accepted, the same values.
		r := bytes.NewReader(data)
		z, err1 := dec1.Decode(r, nil)
		if ok, ok1 := err == nil, err1 == nil && r.Len() == 0; ok != ok1 {
			t.Fatalf("DecodeBytes: %v; Decode: %v with %d bytes left", err, err1, r.Len())
		}
		if err == nil && !slices.Equal(y, z) {
			t.Fatal("DecodeBytes on 2 workers and Decode on 1 give different values")
		}
	})
}

func FuzzReader(f *testing.F) {
	for _, s := range fuzzFrames() {
		f.Add(s)
	}
	dec, _ := NewDecoder(Config{Workers: 1, MaxElements: fuzzMaxElems})
	f.Fuzz(func(t *testing.T, data []byte) {
		rd, err := dec.NewReader(bytes.NewReader(data))
		if err != nil {
			return
		}
		buf := make([]float32, 100)
		total := int64(0)
		for {
			n, err := rd.Read(buf)
			checkDecoded(t, buf[:n])
			total += int64(n)
			if err == io.EOF {
				if total != rd.Header().Count {
					t.Fatalf("read %d of %d elements", total, rd.Header().Count)
				}
				return
			}
			if err != nil {
				return
			}
		}
	})
}

func FuzzErrorFeedback(f *testing.F) {
	for _, s := range fuzzFeedback() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var g ErrorFeedback
		if err := g.UnmarshalBinary(data); err == nil {
			checkDecoded(t, g.State())
			again, _ := g.MarshalBinary()
			if !bytes.Equal(again, data) {
				t.Fatal("state does not re-marshal to the same bytes")
			}
		}
		h, _ := NewErrorFeedback(EF, 64)
		_, _ = h.ReadFrom(bytes.NewReader(data))
	})
}

// FuzzRoundTrip checks the encoders' error bounds on arbitrary float32 input.
func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 192}, uint8(Int8), false, uint64(1))
	f.Add(bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}, 100), uint8(FP16), true, uint64(2))
	encs := map[Config]*Encoder{}
	dec, _ := NewDecoder(DefaultConfig())
	f.Fuzz(func(t *testing.T, data []byte, codec uint8, sr bool, seed uint64) {
		if len(data) > 1<<16 {
			return // bounds are per element; long inputs only slow the fuzzer
		}
		c := Codec(codec%6 + 1)
		x := make([]float32, len(data)/4)
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		cfg := testConfig(c, sr, 1)
		cfg.BlockSize, cfg.ChunkElems = 64, 128
		enc := encs[cfg]
		if enc == nil {
			enc, _ = NewEncoder(cfg)
			encs[cfg] = enc
		}
		frame, err := enc.Append(nil, x, seed)
		if err != nil {
			return // non-finite or out-of-range input, reported as an error
		}
		y, err := dec.DecodeBytes(frame, nil)
		if err != nil {
			t.Fatalf("decoding a valid frame: %v", err)
		}
		for i := range x {
			if d := math.Abs(float64(y[i]) - float64(x[i])); d > elementBound(c, sr, x, i, cfg.BlockSize)*(1+1e-6) {
				t.Fatalf("%v sr=%v element %d: %v -> %v", c, sr, i, x[i], y[i])
			}
		}
	})
}

func fuzzFrames() [][]byte {
	var out [][]byte
	for _, c := range Codecs() {
		for _, level := range []int{0, 1} {
			cfg := testConfig(c, level == 1, level)
			cfg.BlockSize, cfg.ChunkElems = 64, 128
			enc, _ := NewEncoder(cfg)
			for _, n := range []int{0, 5, 300} {
				b, _ := enc.Append(nil, gaussian(n, uint64(n)), 1)
				out = append(out, b)
			}
		}
	}
	return out
}

func fuzzFeedback() [][]byte {
	var out [][]byte
	for _, n := range []int{0, 3, 64} {
		f, _ := NewErrorFeedback(EF, n)
		copy(f.state, gaussian(n, 1))
		b, _ := f.MarshalBinary()
		out = append(out, b)
	}
	return out
}

// TestWriteFuzzCorpus writes the seed corpora checked in under testdata/fuzz.
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("SKEIN_WRITE_FUZZ_CORPUS") == "" {
		t.Skip("set SKEIN_WRITE_FUZZ_CORPUS=1 to regenerate testdata/fuzz")
	}
	write := func(target string, seeds [][]byte) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed%02d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	frames := fuzzFrames()
	// A few damaged frames as well.
	bad := bytes.Clone(frames[len(frames)-1])
	bad[len(bad)/2] ^= 0xff
	frames = append(frames, bad, frames[4][:40])
	write("FuzzDecode", frames)
	write("FuzzReader", frames)
	write("FuzzErrorFeedback", fuzzFeedback())
}
