// Package compression owns how tensors cross the wire: codecs that turn
// []float32 into bytes (fp32, bf16, fp16, blockwise absmax int8/int4 and
// min-max uint8 for contributions and aggregates, each with optional seeded stochastic
// rounding), error feedback state, a zstd entropy stage, and a framed,
// versioned, checksummed wire format read and written through
// io.Reader/io.Writer.
//
// It must not touch the network, the model, or the optimizer: callers hand it
// a flat []float32 and a stream. Everything here is a deterministic function
// of (tensor, seed, Config): the bytes never depend on the number of workers,
// and every float operation is rounded explicitly so that no platform fuses
// a multiply-add differently (the collective needs bit-identical decodes).
//
// # Use
//
//	enc, _ := compression.NewEncoder(compression.DefaultConfig()) // int8, block 256, zstd 1
//	ef, _ := compression.NewErrorFeedback(compression.EF, len(delta))
//	err := ef.Encode(enc, w, delta, round)       // send C(delta + e), keep the residual
//	dec, _ := compression.NewDecoder(compression.DefaultConfig())
//	got, err := dec.Decode(r, buf)               // reuses buf; limits checked first
//
// Encoders and Decoders keep their zstd state and buffers, so a message in
// steady state allocates nothing. Neither is safe for concurrent use.
//
// # Rounding
//
// Nearest rounding is round-half-to-even. Stochastic rounding adds noise u
// in [0, 1) (24 bits, from a splitmix64 hash of (seed, element index), see
// rng.go) and takes the floor, so E[decode] = x up to float32 rounding.
//   - Int8/Int4: scale = absmax/127 (or /7) per block, q = round(x * (127/absmax)),
//     decode q*scale. Blocks with absmax < 2^-100 are sent as zeros with
//     scale 0. Blocks holding |x| > 2^126 are rejected (ErrNonFinite), so
//     decoding is always finite.
//   - MinMax8: per block min and max, q = round((x-min) * (255/(max-min)))
//     or min(floor(... + u), 255); decode min + q*((max-min)/255). A block
//     with max-min < 2^-100 (max == min included) has codes 0 and decodes to
//     min exactly.
//   - Int2: step = absmax/1.5 per block, four levels without a zero,
//     q = round(x/step + 1.5) or min(floor(x/step + 1.5 + u), 3); decode
//     (q-1.5)*step. For pseudo-gradients whose error feedback keeps what
//     rounding loses (the shared support's compacted vector); a block with
//     absmax < 2^-100 has step 0 and codes 2, and decodes to +0.
//   - Sign: a bit per element, ±scale; nearest takes scale = sum x^2 /
//     sum |x| of the block (so the decoded block's projection on x is x)
//     and x's sign bit, stochastic scale = absmax and 1 with probability
//     (1 + x/absmax)/2. The same use as Int2; a block whose scale is below
//     2^-100 has scale 0 and decodes to +0. A decoder reads the scale as
//     sent: how an encoder picks it is not part of the format.
//   - BF16 and FP16 saturate at their largest finite value instead of
//     overflowing to Inf.
//
// NaN and ±Inf in a tensor to encode are an error (ErrNonFinite naming the
// element), never clamped; decoded NaN/Inf (possible only for the float
// codecs of a forged frame) are an error too.
//
// # Wire format, version 1
//
// All integers are little-endian. A frame is a 32-byte header followed by
// ceil(count/chunk) chunks, and nothing else: a Decoder reads exactly the
// frame's bytes, so frames may follow one another on a stream.
//
//	Header (32 bytes)
//	  0  4  magic "SKNT"
//	  4  1  version = 1
//	  5  1  codec id: 1 fp32, 2 bf16, 3 fp16, 4 int8, 5 int4, 6 minmax8, 7 int2,
//	        8 sign
//	  6  1  flags: bit 0 = stochastic rounding was used (informational); other bits 0
//	  7  1  reserved, 0
//	  8  8  element count (uint64)
//	 16  4  block size (uint32), a multiple of 8 in [64, 65536], for every codec
//	 20  4  elements per chunk (uint32), a multiple of the block size, <= 2^24;
//	        chunk i holds elements [i*chunk, min((i+1)*chunk, count))
//	 24  8  xxhash64 of bytes 0..23
//
//	Chunk (20-byte header + payload), chunks in index order
//	  0  8  xxhash64 of bytes 8..end of this chunk (header rest and payload)
//	  8  4  chunk index (uint32), 0, 1, 2, ...
//	 12  1  flags: bit 0 = payload is one zstd frame of the body; other bits 0
//	 13  3  reserved, 0
//	 16  4  payload length L (uint32): equal to the body length when stored raw,
//	        smaller than it when zstd (an encoder stores raw if zstd does not help)
//	 20  L  payload
//
//	Body of a chunk of m elements in nb = ceil(m/block) blocks
//	  fp32     m x float32
//	  bf16     m x uint16 (the high half of the float32)
//	  fp16     m x uint16 IEEE binary16
//	  int8     nb x float32 scale, then m x int8 codes
//	  int4     nb x float32 scale, then ceil(m/2) bytes: element 2k in the low
//	           nibble of byte k, 2k+1 in the high nibble, 4-bit two's complement
//	           (a final unpaired high nibble is 0)
//	  minmax8  nb x (float32 min, float32 max), then m x uint8 codes
//	  int2     nb x float32 step, then ceil(m/4) bytes: element 4k+j in bits
//	           2j and 2j+1 of byte k, code q decoding to (q-1.5)*step (the
//	           unused bits of a final partial byte are 0)
//
// Decoders accept every code value (-128 for int8, -8 for int4) but check
// that scales are finite, non-negative and small enough that every decoded
// value is finite, and that min <= max.
//
// # Bad input
//
// A Decoder checks, in order: magic (ErrBadMagic), version (ErrVersion),
// header checksum (ErrChecksum), codec (ErrCodec), flags (ErrCorrupt), count
// against Config.MaxElements (ErrTooLarge), block size (ErrBlockSize), chunk
// size (ErrTooLarge/ErrCorrupt); then for each chunk its index, flags and
// payload length against the exact body length it must have (ErrCorrupt),
// before reading or allocating the payload; then the checksum (ErrChecksum),
// zstd decoding capped at the body length (ErrCorrupt) and the scales. A
// stream that ends early gives ErrTruncated. No declared size is allocated
// before the bytes it describes have arrived: a chunk's payload buffer grows
// as its bytes are read, and unless the caller's dst already holds the
// declared count, Decode grows its output only for chunks read whole whose
// checksums match, to at most twice the elements received so far, and
// DecodeBytes allocates it for the chunks that src holds whole; never beyond
// the count, itself at most MaxElements. A forged header thus costs memory
// in proportion to the chunks that follow it (a zstd chunk may be far
// smaller than the elements it holds); beyond the output, a Decoder keeps two
// chunk buffers per worker. Nothing panics on malformed input (see the fuzz
// targets and their seed corpora in testdata/fuzz).
//
// # Error feedback state
//
// ErrorFeedback.WriteTo writes: "SKEF", version 1, mode (1 EF, 2 EF21), two
// zero bytes, element count (uint64), the state (count x float32), and the
// xxhash64 of everything before it.
package compression
