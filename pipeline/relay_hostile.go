package pipeline

import (
	"encoding/binary"
	"math"

	"github.com/cespare/xxhash/v2"

	"github.com/skein-ml/skein/compression"
)

// A hostile node's relay, for the chaos soak only (skein demo --hostile
// staged-grad, node.HostileStagedGrad): with RelayConfig.Hostile the relay
// poisons the activations and gradients this node sends, and nothing else.
// Honest code never tests the flag: the hook sits in sendTensor, where the
// node's own tensors leave it, so what the neighbours receive is what a
// hostile member of the run could put on the wire.
//
// The attack alternates so that each receive path is hit, whichever
// microbatches the schedule gives the node (a rotating schedule sends
// only odd or only even ones through some stages): where iter+mb is even
// the activation is poisoned (and the microbatch never gets as far as a
// gradient), where it is odd the activation goes out honest and the
// gradient poisoned. Every value is the largest finite bf16 (finite, so
// only the relay's norm bound stops it) in iterations 4k and 4k+1, and
// in 4k+2 and 4k+3 the first value of the frame is NaN, forged into the
// encoded bytes because the encoder refuses it: over four iterations a
// microbatch index meets every pair of kind and poison.

// hostileMax is the value of a hostile relay's outsized tensors: the
// largest finite bf16, which bf16 (the relay's codec) and fp32 carry
// exactly.
const hostileMax = float32(3.3895314e38)

// hostilePoisons reports whether a hostile relay poisons the tensor of
// kind k it sends for microbatch mb of iteration iter.
func hostilePoisons(k relayKind, iter uint64, mb uint32) bool {
	return (k == kindAct) == ((iter+uint64(mb))%2 == 0)
}

// hostileNaN reports whether a hostile relay's poison in iteration iter
// is a forged NaN (else every value hostileMax).
func hostileNaN(iter uint64) bool { return iter/2%2 == 1 }

// hostileFrame encodes what a hostile relay sends instead of x in
// iteration iter: x with a forged NaN or every value hostileMax
// (hostileNaN), hostileMax too where there is no NaN to forge (a chunk
// stored with zstd; the integer codecs, which refuse both, leave the
// hostile node's own visit failed).
func (r *Relay) hostileFrame(x []float32, iter, seed uint64) ([]byte, error) {
	if hostileNaN(iter) {
		frame, err := r.enc.Append(nil, x, seed)
		if err != nil || forgeNaN(frame) {
			return frame, err
		}
	}
	big := make([]float32, len(x))
	for i := range big {
		big[i] = hostileMax
	}
	return r.enc.Append(nil, big, seed)
}

// The parts of compression's wire format (compression/doc.go) forgeNaN
// rewrites: the frame header's length and codec byte, and a chunk's
// header, whose checksum covers the rest of the chunk.
const (
	frameHeaderLen = 32
	frameCodecAt   = 5
	chunkHeaderLen = 20
	chunkFlagsAt   = 12
	chunkLenAt     = 16
	chunkZstd      = 1
)

// forgeNaN writes a NaN over the first value of frame's first chunk and
// fixes the chunk's checksum, so that the frame decodes up to that value;
// false when it cannot (not a float codec, a chunk stored with zstd, or
// too short a frame), leaving frame as it was.
func forgeNaN(frame []byte) bool {
	if len(frame) < frameHeaderLen+chunkHeaderLen {
		return false
	}
	var nan []byte
	switch compression.Codec(frame[frameCodecAt]) {
	case compression.FP32:
		nan = binary.LittleEndian.AppendUint32(nil, math.Float32bits(float32(math.NaN())))
	case compression.BF16:
		nan = binary.LittleEndian.AppendUint16(nil, uint16(math.Float32bits(float32(math.NaN()))>>16))
	case compression.FP16:
		nan = binary.LittleEndian.AppendUint16(nil, 0x7e00)
	default:
		return false
	}
	c := frame[frameHeaderLen:]
	n := int(binary.LittleEndian.Uint32(c[chunkLenAt:]))
	if c[chunkFlagsAt]&chunkZstd != 0 || n < len(nan) || chunkHeaderLen+n > len(c) {
		return false
	}
	copy(c[chunkHeaderLen:], nan)
	binary.LittleEndian.PutUint64(c, xxhash.Sum64(c[8:chunkHeaderLen+n]))
	return true
}
