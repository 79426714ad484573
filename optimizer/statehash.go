package optimizer

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// StateChunkBytes is the piece of a shared state that is hashed on its own:
// a joiner checks every chunk it downloads against its hash and takes a bad
// one again from another member, instead of the whole state. A multiple of
// 4, so that chunks hold whole float32s.
const StateChunkBytes = 1 << 20

// StateChunks is how many chunks a state of n parameters has: its body is
// phi then the momentum, 8n bytes.
func StateChunks(n int) int { return int((8*int64(n) + StateChunkBytes - 1) / StateChunkBytes) }

// StateChunkHashes returns the SHA-256 of each StateChunkBytes piece of the
// state's body: phi then the momentum, float32 bits little-endian. On a
// little-endian host it hashes the slices' memory in place (no copy: the
// state of a 124M model is 1 GB, hashed every round), its chunks spread
// over GOMAXPROCS goroutines; elsewhere it streams through a buffer of one
// chunk. Hashing the encoded body's slices with sha256.Sum256 gives the
// same hashes.
func StateChunkHashes(phi, mom []float32) [][sha256.Size]byte {
	if !littleEndian {
		return stateChunkHashesPortable(phi, mom)
	}
	pb := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(phi))), 4*len(phi))
	mb := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(mom))), 4*len(mom))
	out := make([][sha256.Size]byte, StateChunks(len(phi)))
	chunk := func(c int) {
		lo, hi := c*StateChunkBytes, min((c+1)*StateChunkBytes, len(pb)+len(mb))
		switch {
		case hi <= len(pb):
			out[c] = sha256.Sum256(pb[lo:hi])
		case lo >= len(pb):
			out[c] = sha256.Sum256(mb[lo-len(pb) : hi-len(pb)])
		default: // the chunk where phi ends and the momentum starts
			h := sha256.New()
			h.Write(pb[lo:])
			h.Write(mb[:hi-len(pb)])
			h.Sum(out[c][:0])
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(out))
	if workers <= 1 {
		for c := range out {
			chunk(c)
		}
		return out
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for c := int(next.Add(1) - 1); c < len(out); c = int(next.Add(1) - 1) {
				chunk(c)
			}
		})
	}
	wg.Wait()
	return out
}

// littleEndian is whether this host stores a float32's bits as the state's
// body does.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// AppendFloats appends v as the state's body stores it, float32 bits
// little-endian: on a little-endian host its memory as it is, one copy (a
// loop of one AppendUint32 a value took 3 s of the 3.1 s a volunteer spent
// serving a 124M state on one core).
func AppendFloats(b []byte, v []float32) []byte {
	if littleEndian {
		return append(b, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))...)
	}
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// stateChunkHashesPortable is StateChunkHashes on any host.
func stateChunkHashesPortable(phi, mom []float32) [][sha256.Size]byte {
	out := make([][sha256.Size]byte, 0, StateChunks(len(phi)))
	buf := make([]byte, 0, StateChunkBytes)
	flush := func() {
		out = append(out, sha256.Sum256(buf))
		buf = buf[:0]
	}
	for _, v := range [][]float32{phi, mom} {
		for _, x := range v {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(x))
			if len(buf) == StateChunkBytes {
				flush()
			}
		}
	}
	if len(buf) > 0 {
		flush()
	}
	return out
}

// stateRootDomain separates state roots from every other SHA-256 the run
// computes.
const stateRootDomain = "skein/state/2"

// StateRoot names a state by its round, its size and its chunk hashes: the
// first 8 bytes (big-endian) of SHA-256(domain, round, n, chunk size, the
// chunk hashes in order), integers little-endian. It is the state hash that
// members gossip (signed), compare to find divergence and check downloads
// against. A cryptographic hash, so no member can serve another state, or
// another chunk, under the hash the others announce (finding a second
// preimage of a 64-bit prefix costs about 2^64 hashes). It never comes out
// 0, which gossip reads as "no state".
func StateRoot(round uint64, n int, chunks [][sha256.Size]byte) uint64 {
	return StateRootWith(round, n, chunks, [sha256.Size]byte{})
}

// StateRootWith is StateRoot over a state that carries more than phi and
// the momentum: extra is the SHA-256 of the rest (a run over a packed
// dataset: its data ledger, data.Ledger), hashed after the chunk hashes. A
// zero extra is no extra: StateRoot.
func StateRootWith(round uint64, n int, chunks [][sha256.Size]byte, extra [sha256.Size]byte) uint64 {
	h := sha256.New()
	h.Write([]byte(stateRootDomain))
	var b [20]byte
	binary.LittleEndian.PutUint64(b[0:], round)
	binary.LittleEndian.PutUint64(b[8:], uint64(n))
	binary.LittleEndian.PutUint32(b[16:], StateChunkBytes)
	h.Write(b[:])
	for _, c := range chunks {
		h.Write(c[:])
	}
	if extra != ([sha256.Size]byte{}) {
		h.Write(extra[:])
	}
	if v := binary.BigEndian.Uint64(h.Sum(nil)); v != 0 {
		return v
	}
	return 1
}

// StateHashOf is the state hash (StateRoot) of round, phi and the momentum.
func StateHashOf(round uint64, phi, mom []float32) uint64 {
	return StateRoot(round, len(phi), StateChunkHashes(phi, mom))
}
