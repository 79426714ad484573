package data

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"unicode/utf8"
)

// Errors about shards, returned wrapped; test them with errors.Is.
var (
	// ErrShardFormat means a shard's bytes, or a ShardInfo describing one,
	// break the rules of the shard format (see the package documentation):
	// a bad magic, count, key or length, trailing bytes, a hash that is not
	// 64 lowercase hex digits, a size beyond MaxShardBytes.
	ErrShardFormat = errors.New("data: malformed shard")
	// ErrShardCorrupt means a shard's bytes do not hash to its name or do not
	// have its size. The store has deleted them; fetch the shard again,
	// preferably from another member.
	ErrShardCorrupt = errors.New("data: shard corrupt")
	// ErrShardMissing means a shard is not installed in the store.
	ErrShardMissing = errors.New("data: shard not in store")
	// ErrShardIncomplete means Commit was called before Confirm had recorded
	// every byte of the shard as written.
	ErrShardIncomplete = errors.New("data: shard download incomplete")
	// ErrShardBusy means another PartialShard of the same shard is open in
	// this store.
	ErrShardBusy = errors.New("data: shard download already in progress")
)

// Limits and defaults of the shard format.
const (
	// ShardMagic opens every shard; its last byte is the format version.
	ShardMagic = "SKSHARD1"
	// MaxShardBytes bounds a shard's total size, header included.
	MaxShardBytes = 1 << 30
	// MaxShardFiles bounds the number of files in one shard.
	MaxShardFiles = 1 << 20
	// MaxKeyBytes bounds the length of a file's key.
	MaxKeyBytes = 1024
	// DefaultShardBytes is PackShards' target size when it is given 0.
	DefaultShardBytes = 4 << 20

	shardFixedHeader = len(ShardMagic) + 4 // magic, file count
	shardEntryFixed  = 2 + 8               // key length, file size
	shardKeyPrefix   = "shard/"
)

// ShardInfo names one shard in a run manifest.
type ShardInfo struct {
	Hash  string // SHA-256 of the shard's bytes, 64 lowercase hex digits
	Bytes int64  // the shard's size, header included
	Files int    // number of files inside
}

// Validate reports whether info can describe a shard at all, wrapping
// ErrShardFormat.
func (info ShardInfo) Validate() error {
	if !validHash(info.Hash) {
		return fmt.Errorf("data: shard hash %q is not 64 lowercase hex digits: %w", info.Hash, ErrShardFormat)
	}
	if info.Bytes < int64(shardFixedHeader+shardEntryFixed+2) || info.Bytes > MaxShardBytes {
		return fmt.Errorf("data: shard %s: size %d out of range [%d, %d]: %w", info.Hash, info.Bytes, shardFixedHeader+shardEntryFixed+2, MaxShardBytes, ErrShardFormat)
	}
	if info.Files < 1 || info.Files > MaxShardFiles {
		return fmt.Errorf("data: shard %s: file count %d out of range [1, %d]: %w", info.Hash, info.Files, MaxShardFiles, ErrShardFormat)
	}
	if int64(info.Files)*int64(shardEntryFixed+2) > info.Bytes {
		return fmt.Errorf("data: shard %s: %d files cannot fit in %d bytes: %w", info.Hash, info.Files, info.Bytes, ErrShardFormat)
	}
	return nil
}

// validHash reports whether h is 64 lowercase hex digits.
func validHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	for i := range len(h) {
		c := h[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ShardKey returns the bulk-transfer key under which members serve the
// shard with this hash: "shard/" followed by the hash.
func ShardKey(hash string) string { return shardKeyPrefix + hash }

// ParseShardKey returns the hash named by a bulk-transfer key made by
// ShardKey; ok is false unless key is "shard/" followed by 64 lowercase hex
// digits.
func ParseShardKey(key string) (hash string, ok bool) {
	hash, ok = strings.CutPrefix(key, shardKeyPrefix)
	if !ok || !validHash(hash) {
		return "", false
	}
	return hash, true
}

// hashString returns the lowercase hex form of a SHA-256 sum.
func hashString(sum []byte) string { return hex.EncodeToString(sum) }

// ValidKey reports whether key can name a file inside a shard: 1 to
// MaxKeyBytes bytes of valid UTF-8 without NUL, slash-separated, neither
// starting nor ending with a slash, with no empty, "." or ".." element (the
// rules of io/fs.ValidPath, minus the root "."). Every key a directory
// corpus produces is valid unless a file name is not UTF-8 or holds NUL.
func ValidKey(key string) bool {
	return len(key) >= 1 && len(key) <= MaxKeyBytes && key != "." &&
		utf8.ValidString(key) && strings.IndexByte(key, 0) < 0 && fs.ValidPath(key)
}

// ShardFile is one file inside a shard.
type ShardFile struct {
	Key    string // slash-separated path relative to the corpus root: the split key
	Offset int64  // where the file's bytes start, from the start of the shard
	Size   int64  // bytes, >= 1
}

// ShardIndex lists a shard's files in the order they are stored, which is
// non-decreasing byte order of Key.
type ShardIndex struct {
	Files []ShardFile
	Size  int64 // the shard's total size
}

// shardHeaderSize returns the header length of a shard holding files with
// these keys.
func shardHeaderSize(keys []string) int64 {
	n := int64(shardFixedHeader)
	for _, k := range keys {
		n += int64(shardEntryFixed + len(k))
	}
	return n
}

// appendShardHeader appends the header of a shard holding files (key, size)
// in order. The caller has checked the keys and sizes.
func appendShardHeader(b []byte, keys []string, sizes []int64) []byte {
	b = append(b, ShardMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(keys)))
	for i, k := range keys {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(k)))
		b = append(b, k...)
		b = binary.LittleEndian.AppendUint64(b, uint64(sizes[i]))
	}
	return b
}

// ReadShardIndex decodes the header of the shard of size bytes that r holds
// and checks it against the format: the magic, a count in [1,
// MaxShardFiles], keys that are ValidKey and in non-decreasing order, file
// sizes >= 1, and header plus data adding up to exactly size (no trailing
// bytes). Every declared length is checked against size before it is used,
// memory grows only with the header bytes actually read, and malformed input
// yields an error wrapping ErrShardFormat, never a panic. It does not hash
// the shard: that is the store's job.
func ReadShardIndex(r io.ReaderAt, size int64) (ShardIndex, error) {
	if size < int64(shardFixedHeader) || size > MaxShardBytes {
		return ShardIndex{}, fmt.Errorf("data: shard size %d out of range [%d, %d]: %w", size, shardFixedHeader, MaxShardBytes, ErrShardFormat)
	}
	br := bufio.NewReaderSize(io.NewSectionReader(r, 0, size), 64<<10)
	var fixed [shardFixedHeader]byte
	if _, err := io.ReadFull(br, fixed[:]); err != nil {
		return ShardIndex{}, shardReadErr("header", err)
	}
	if string(fixed[:len(ShardMagic)]) != ShardMagic {
		return ShardIndex{}, fmt.Errorf("data: shard magic %q, want %q: %w", fixed[:len(ShardMagic)], ShardMagic, ErrShardFormat)
	}
	count := int64(binary.LittleEndian.Uint32(fixed[len(ShardMagic):]))
	if count < 1 || count > MaxShardFiles {
		return ShardIndex{}, fmt.Errorf("data: shard file count %d out of range [1, %d]: %w", count, MaxShardFiles, ErrShardFormat)
	}
	// Each entry needs at least a 1-byte key and 1 byte of data.
	if minSize := int64(shardFixedHeader) + count*(shardEntryFixed+2); minSize > size {
		return ShardIndex{}, fmt.Errorf("data: shard file count %d needs at least %d bytes, shard has %d: %w", count, minSize, size, ErrShardFormat)
	}
	idx := ShardIndex{Size: size, Files: make([]ShardFile, 0, min(count, 1024))}
	header := int64(shardFixedHeader) // header bytes so far
	var data int64                    // sum of file sizes so far
	var keyBuf [MaxKeyBytes]byte
	var num [8]byte
	prev := ""
	for i := range count {
		if _, err := io.ReadFull(br, num[:2]); err != nil {
			return ShardIndex{}, shardReadErr(fmt.Sprintf("entry %d", i), err)
		}
		klen := int64(binary.LittleEndian.Uint16(num[:2]))
		if klen < 1 || klen > MaxKeyBytes {
			return ShardIndex{}, fmt.Errorf("data: shard entry %d: key length %d out of range [1, %d]: %w", i, klen, MaxKeyBytes, ErrShardFormat)
		}
		header += shardEntryFixed + klen
		if header+data > size {
			return ShardIndex{}, fmt.Errorf("data: shard entry %d: header reaches byte %d, past the shard's %d: %w", i, header+data, size, ErrShardFormat)
		}
		if _, err := io.ReadFull(br, keyBuf[:klen]); err != nil {
			return ShardIndex{}, shardReadErr(fmt.Sprintf("entry %d key", i), err)
		}
		key := string(keyBuf[:klen])
		if !ValidKey(key) {
			return ShardIndex{}, fmt.Errorf("data: shard entry %d: invalid key %q: %w", i, key, ErrShardFormat)
		}
		if key < prev {
			return ShardIndex{}, fmt.Errorf("data: shard entry %d: key %q sorts before the previous %q: %w", i, key, prev, ErrShardFormat)
		}
		prev = key
		if _, err := io.ReadFull(br, num[:8]); err != nil {
			return ShardIndex{}, shardReadErr(fmt.Sprintf("entry %d size", i), err)
		}
		fsize := binary.LittleEndian.Uint64(num[:8])
		if fsize < 1 || fsize > uint64(size-header-data) {
			return ShardIndex{}, fmt.Errorf("data: shard entry %d (%q): file size %d out of range [1, %d]: %w", i, key, fsize, size-header-data, ErrShardFormat)
		}
		idx.Files = append(idx.Files, ShardFile{Key: key, Offset: data, Size: int64(fsize)}) // Offset fixed below
		data += int64(fsize)
	}
	if header+data != size {
		return ShardIndex{}, fmt.Errorf("data: shard holds %d header and %d file bytes but is %d bytes long (%d trailing): %w", header, data, size, size-header-data, ErrShardFormat)
	}
	for i := range idx.Files {
		idx.Files[i].Offset += header
	}
	return idx, nil
}

func shardReadErr(what string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("data: shard %s truncated: %w", what, ErrShardFormat)
	}
	return fmt.Errorf("data: reading shard %s: %w", what, err)
}
