package compression

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		edit func(*Config)
		err  error
		msg  string
	}{
		{func(c *Config) { c.BlockSize = 0 }, ErrBlockSize, "block size 0 out of range [64, 65536]"},
		{func(c *Config) { c.BlockSize = 1 << 17 }, ErrBlockSize, "block size 131072 out of range [64, 65536]"},
		{func(c *Config) { c.BlockSize = 100 }, ErrBlockSize, "block size 100 not a multiple of 8"},
		{func(c *Config) { c.Codec = 0 }, ErrCodec, "codec id 0"},
		{func(c *Config) { c.ZstdLevel = 23 }, ErrConfig, "zstd level 23 out of range [0, 22]"},
		{func(c *Config) { c.ChunkElems = 1000 }, ErrConfig, "chunk elements 1000 not a multiple of block size 256"},
		{func(c *Config) { c.ChunkElems = 1 << 25 }, ErrConfig, "chunk elements 33554432 out of range"},
		{func(c *Config) { c.Workers = -1 }, ErrConfig, "workers -1"},
		{func(c *Config) { c.MaxElements = -1 }, ErrConfig, "max elements -1"},
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		cfg := DefaultConfig()
		tc.edit(&cfg)
		err := cfg.Validate()
		if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) || !strings.HasPrefix(err.Error(), "compression: ") {
			t.Errorf("got %v, want %v containing %q", err, tc.err, tc.msg)
		}
		if _, err := NewEncoder(cfg); !errors.Is(err, tc.err) {
			t.Errorf("NewEncoder: got %v, want %v", err, tc.err)
		}
	}
	if _, err := NewErrorFeedback(3, 10); !errors.Is(err, ErrConfig) {
		t.Errorf("feedback mode 3: %v", err)
	}
}

func TestNonFiniteInput(t *testing.T) {
	for _, c := range Codecs() {
		for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
			x := gaussian(3000, 1)
			x[2500] = bad
			cfg := testConfig(c, false, 1)
			cfg.ChunkElems = 1024
			enc, _ := NewEncoder(cfg)
			_, err := enc.Append(nil, x, 0)
			if !errors.Is(err, ErrNonFinite) || !strings.Contains(err.Error(), "element 2500") {
				t.Errorf("%v with %v: got %v, want ErrNonFinite naming element 2500", c, bad, err)
			}
			ef, _ := NewErrorFeedback(EF, len(x))
			if err := ef.Encode(enc, &bytes.Buffer{}, x, 0); !errors.Is(err, ErrNonFinite) {
				t.Errorf("%v feedback: got %v", c, err)
			}
			for _, v := range ef.State() {
				if v != 0 {
					t.Fatalf("%v: feedback state changed by a rejected tensor", c)
				}
			}
		}
	}
	// Blockwise codecs reject magnitudes beyond 2^126 so decoding stays finite.
	enc, _ := NewEncoder(DefaultConfig())
	if _, err := enc.Append(nil, []float32{math.MaxFloat32}, 0); !errors.Is(err, ErrNonFinite) {
		t.Errorf("int8 MaxFloat32: %v", err)
	}
}

// validFrame returns a small frame with several chunks.
func validFrame(t testing.TB, c Codec, level int) []byte {
	cfg := testConfig(c, false, level)
	cfg.BlockSize = 64
	cfg.ChunkElems = 256
	enc, _ := NewEncoder(cfg)
	b, err := enc.Append(nil, gaussian(1000, 2), 0)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// reheader edits the frame header and recomputes its checksum.
func reheader(frame []byte, edit func(h []byte)) []byte {
	b := bytes.Clone(frame)
	edit(b[:headerLen])
	binary.LittleEndian.PutUint64(b[24:], xxhash.Sum64(b[:24]))
	return b
}

func TestBadFrames(t *testing.T) {
	good := validFrame(t, Int8, 1)
	cases := []struct {
		name  string
		frame []byte
		err   error
		msg   string
	}{
		{"empty", nil, ErrTruncated, "header ends after 0 of 32 bytes"},
		{"short header", good[:10], ErrTruncated, "header ends after 10 of 32 bytes"},
		{"no chunks", good[:headerLen], ErrTruncated, "chunk 0 of 4 header ends after 0 of 20 bytes"},
		{"short payload", good[:len(good)-1], ErrTruncated, "chunk 3 of 4 payload ends after"},
		{"magic", append([]byte("SKNX"), good[4:]...), ErrBadMagic, `"SKNX"`},
		{"version", reheader(good, func(h []byte) { h[4] = 2 }), ErrVersion, "version 2"},
		{"header checksum", append(bytes.Clone(good[:24]), append([]byte{1, 2, 3, 4, 5, 6, 7, 8}, good[32:]...)...), ErrChecksum, "header checksum"},
		{"payload checksum", func() []byte { b := bytes.Clone(good); b[len(b)-5] ^= 1; return b }(), ErrChecksum, "chunk 3 of 4"},
		{"too many elements", reheader(good, func(h []byte) { binary.LittleEndian.PutUint64(h[8:], 1<<40) }), ErrTooLarge, "1099511627776 elements, limit 1048576"},
		{"block size 0", reheader(good, func(h []byte) { binary.LittleEndian.PutUint32(h[16:], 0) }), ErrBlockSize, "block size 0 out of range"},
		{"block size huge", reheader(good, func(h []byte) { binary.LittleEndian.PutUint32(h[16:], 1<<20) }), ErrBlockSize, "1048576 out of range"},
		{"codec", reheader(good, func(h []byte) { h[5] = 42 }), ErrCodec, "codec id 42"},
		{"flags", reheader(good, func(h []byte) { h[6] = 0x80 }), ErrCorrupt, "flags"},
		{"chunk too large", reheader(good, func(h []byte) { binary.LittleEndian.PutUint32(h[20:], 1<<30) }), ErrTooLarge, "elements per chunk"},
		{"chunk not multiple", reheader(good, func(h []byte) { binary.LittleEndian.PutUint32(h[20:], 100) }), ErrCorrupt, "chunk elements 100"},
		{"trailing bytes", append(bytes.Clone(good), 0), ErrCorrupt, "1 bytes after the frame"},
	}
	dec, _ := NewDecoder(Config{MaxElements: 1 << 20})
	for _, tc := range cases {
		_, err := dec.DecodeBytes(tc.frame, nil)
		if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: got %v, want %v containing %q", tc.name, err, tc.err, tc.msg)
		}
	}
	// Every prefix of every codec's frame fails cleanly with ErrTruncated.
	for _, c := range Codecs() {
		for _, level := range []int{0, 1} {
			f := validFrame(t, c, level)
			for n := range len(f) {
				if _, err := dec.DecodeBytes(f[:n], nil); !errors.Is(err, ErrTruncated) {
					t.Fatalf("%v prefix %d of %d: %v", c, n, len(f), err)
				}
			}
		}
	}
}

func TestBadFeedbackState(t *testing.T) {
	f, _ := NewErrorFeedback(EF, 100)
	copy(f.state, gaussian(100, 1))
	good, _ := f.MarshalBinary()
	cases := []struct {
		name string
		data []byte
		err  error
	}{
		{"empty", nil, ErrTruncated},
		{"short", good[:len(good)-4], ErrTruncated},
		{"long", append(bytes.Clone(good), 0), ErrCorrupt},
		{"magic", append([]byte("XXXX"), good[4:]...), ErrBadMagic},
		{"version", func() []byte { b := bytes.Clone(good); b[4] = 9; return b }(), ErrVersion},
		{"mode", func() []byte { b := bytes.Clone(good); b[5] = 9; return b }(), ErrCorrupt},
		{"huge count", func() []byte { b := bytes.Clone(good); binary.LittleEndian.PutUint64(b[8:], 1<<60); return b }(), ErrTruncated},
		{"checksum", func() []byte { b := bytes.Clone(good); b[20] ^= 1; return b }(), ErrChecksum},
	}
	for _, tc := range cases {
		var g ErrorFeedback
		if err := g.UnmarshalBinary(tc.data); !errors.Is(err, tc.err) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.err)
		}
	}
	other, _ := NewErrorFeedback(EF, 99)
	if _, err := other.ReadFrom(bytes.NewReader(good)); !errors.Is(err, ErrSize) {
		t.Errorf("length mismatch: %v", err)
	}
}

// A header declaring a large tensor, or a chunk header declaring a large
// payload, followed by little or nothing, costs memory in proportion to the
// bytes that arrived, not to the declared sizes.
func TestForgedSizesAllocateLittle(t *testing.T) {
	const count = 1 << 26 // 256 MiB of float32
	const limit = 1 << 20 // bytes a failed decode may allocate
	var hdr [headerLen]byte
	putHeader(&hdr, Header{Codec: FP32, Count: count, BlockSize: 64, ChunkElems: MaxChunkElems})
	rawLen := bodyLen(FP32, MaxChunkElems, 64) // 64 MiB
	chunk := func(flags byte, stored int) []byte {
		c := make([]byte, chunkHeaderLen)
		c[12] = flags
		binary.LittleEndian.PutUint32(c[16:], uint32(stored))
		return c
	}
	payload := bytes.Repeat([]byte{1}, 1000)
	// One genuine chunk of 1<<14 elements (64 KiB), then the stream ends.
	cfg := testConfig(FP32, false, 0)
	cfg.BlockSize, cfg.ChunkElems = 64, 1<<14
	enc, _ := NewEncoder(cfg)
	one, err := enc.Append(nil, gaussian(1<<14, 1), 0)
	if err != nil {
		t.Fatal(err)
	}
	one = reheader(one, func(h []byte) { binary.LittleEndian.PutUint64(h[8:], count) })
	cases := []struct {
		name  string
		frame []byte
		msg   string
	}{
		{"no chunks", hdr[:], "chunk 0 of 4 header ends after 0 of 20 bytes"},
		{"raw payload cut", slices.Concat(hdr[:], chunk(0, rawLen), payload), "chunk 0 of 4 payload ends after 1000 of 67108864 bytes"},
		{"zstd payload cut", slices.Concat(hdr[:], chunk(flagZstd, rawLen-1), payload), "chunk 0 of 4 payload ends after 1000 of 67108863 bytes"},
		{"one of 4096 chunks", one, "chunk 1 of 4096 header ends after 0 of 20 bytes"},
	}
	for _, workers := range []int{1, 4} {
		for _, tc := range cases {
			frame := tc.frame
			// check runs decode on a fresh Decoder, whose buffers are empty.
			check := func(path string, decode func(*Decoder) error) {
				t.Helper()
				dec, err := NewDecoder(Config{Workers: workers, MaxElements: count})
				if err != nil {
					t.Fatal(err)
				}
				defer dec.Close()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				err = decode(dec)
				runtime.ReadMemStats(&after)
				if !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), tc.msg) {
					t.Errorf("%s, %s, %d workers: got %v, want ErrTruncated containing %q", tc.name, path, workers, err, tc.msg)
				}
				if n := after.TotalAlloc - before.TotalAlloc; n > limit {
					t.Errorf("%s, %s, %d workers: allocated %d bytes for a %d-byte frame declaring %d elements", tc.name, path, workers, n, len(frame), count)
				}
			}
			check("Decode", func(dec *Decoder) error {
				_, err := dec.Decode(bytes.NewReader(frame), nil)
				return err
			})
			check("DecodeBytes", func(dec *Decoder) error {
				_, err := dec.DecodeBytes(frame, nil)
				return err
			})
			check("Reader", func(dec *Decoder) error {
				rd, err := dec.NewReader(bytes.NewReader(frame))
				if err != nil {
					return err
				}
				buf := make([]float32, 100)
				for err == nil {
					_, err = rd.Read(buf)
				}
				return err
			})
		}
	}
}

// Decode and DecodeBytes leave a too small dst untouched (Decode growing its
// own output over several steps) and decode in place into a large enough one,
// with the same values for any worker count.
func TestDecodeDestination(t *testing.T) {
	x := gaussian(10_000, 3)
	cfg := testConfig(Int8, false, 1)
	cfg.ChunkElems = 512 // 20 chunks
	enc, _ := NewEncoder(cfg)
	frame, err := enc.Append(nil, x, 1)
	if err != nil {
		t.Fatal(err)
	}
	var want []float32
	for _, workers := range []int{1, 2, 3, 8} {
		dec, _ := NewDecoder(Config{Workers: workers, MaxElements: 1 << 20})
		for _, path := range []string{"Decode", "DecodeBytes"} {
			decode := func(dst []float32) ([]float32, error) {
				if path == "Decode" {
					return dec.Decode(bytes.NewReader(frame), dst)
				}
				return dec.DecodeBytes(frame, dst)
			}
			small := make([]float32, 100, 5000)
			got, err := decode(small)
			if err != nil {
				t.Fatalf("%s, %d workers: %v", path, workers, err)
			}
			if !slices.Equal(small[:cap(small)], make([]float32, cap(small))) {
				t.Fatalf("%s, %d workers: a too small dst was written", path, workers)
			}
			if want == nil {
				want = got
			} else if !slices.Equal(got, want) {
				t.Fatalf("%s, %d workers: decode differs from Decode on 1 worker", path, workers)
			}
			big := make([]float32, 0, 20_000)
			got, err = decode(big)
			if err != nil || &got[0] != &big[:1][0] || !slices.Equal(got, want) {
				t.Fatalf("%s, %d workers: decode into a large dst: %v", path, workers, err)
			}
		}
		dec.Close()
	}
	if relL2(x, want) > gaussianRelL2[Int8] {
		t.Fatalf("relative L2 error %g", relL2(x, want))
	}
}
