package data

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// shardBytes encodes a shard holding files (key, contents) in the given
// order, without checking them.
func shardBytes(keys []string, contents [][]byte) []byte {
	sizes := make([]int64, len(keys))
	for i, c := range contents {
		sizes[i] = int64(len(c))
	}
	b := appendShardHeader(nil, keys, sizes)
	for _, c := range contents {
		b = append(b, c...)
	}
	return b
}

func infoOf(b []byte, files int) ShardInfo {
	sum := sha256.Sum256(b)
	return ShardInfo{Hash: hashString(sum[:]), Bytes: int64(len(b)), Files: files}
}

func TestReadShardIndexRoundTrip(t *testing.T) {
	keys := []string{"a.go", "a.go", "dir/b.go", "dir/sub/c.txt", "é/ü.go"}
	contents := [][]byte{[]byte("package a\n"), []byte("x"), bytes.Repeat([]byte("b"), 1000), []byte("ccc"), []byte("ü")}
	b := shardBytes(keys, contents)
	idx, err := ReadShardIndex(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if idx.Size != int64(len(b)) || len(idx.Files) != len(keys) {
		t.Fatalf("index %+v, want %d files of %d bytes", idx, len(keys), len(b))
	}
	for i, f := range idx.Files {
		if f.Key != keys[i] || f.Size != int64(len(contents[i])) {
			t.Errorf("file %d = %+v, want key %q size %d", i, f, keys[i], len(contents[i]))
		}
		if got := b[f.Offset : f.Offset+f.Size]; !bytes.Equal(got, contents[i]) {
			t.Errorf("file %d %q at offset %d holds %q, want %q", i, f.Key, f.Offset, got, contents[i])
		}
	}
	if h := shardHeaderSize(keys); idx.Files[0].Offset != h {
		t.Errorf("first file at %d, header is %d bytes", idx.Files[0].Offset, h)
	}
}

func TestReadShardIndexRejects(t *testing.T) {
	good := shardBytes([]string{"a", "b/c"}, [][]byte{[]byte("xy"), []byte("z")})
	with := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	entry := func(key string, size uint64) []byte {
		b := binary.LittleEndian.AppendUint16(nil, uint16(len(key)))
		b = append(b, key...)
		return binary.LittleEndian.AppendUint64(b, size)
	}
	one := func(key string, size uint64, data int) []byte {
		b := append([]byte(ShardMagic), 1, 0, 0, 0)
		b = append(b, entry(key, size)...)
		return append(b, bytes.Repeat([]byte{'d'}, data)...)
	}
	cases := []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "size 0 out of range"},
		{"short", []byte("SKSHARD1\x01"), "size 9 out of range"},
		{"magic", with(func(b []byte) []byte { b[7] = '2'; return b }), "magic"},
		{"count 0", with(func(b []byte) []byte { b[8] = 0; return b }), "count 0"},
		{"count huge", with(func(b []byte) []byte { b[11] = 0xff; return b }), "count"},
		{"count beyond size", with(func(b []byte) []byte { b[8] = 3; return b }), "needs at least"},
		{"key length 0", one("", 1, 2), "key length 0"},
		{"key length 1025", append(one(strings.Repeat("k", 1025), 1, 1), make([]byte, 100)...), "key length 1025"},
		{"key ..", one("a/../b", 1, 1), "invalid key"},
		{"key absolute", one("/etc", 1, 1), "invalid key"},
		{"key trailing slash", one("a/", 1, 1), "invalid key"},
		{"key empty element", one("a//b", 1, 1), "invalid key"},
		{"key dot", one(".", 1, 1), "invalid key"},
		{"key NUL", one("a\x00b", 1, 1), "invalid key"},
		{"key not UTF-8", one("a\xffb", 1, 1), "invalid key"},
		{"file size 0", one("a", 0, 1), "file size 0"},
		{"file size past end", one("a", 5, 4), "file size 5"},
		{"file size huge", one("a", 1<<63, 4), "file size"},
		{"trailing byte", append(bytes.Clone(good), 0), "1 trailing"},
		{"truncated data", good[:len(good)-1], "file size 1 out of range"},
		{"truncated header", good[:14], "needs at least"},
		{"unsorted", shardBytes([]string{"b", "a"}, [][]byte{{1}, {2}}), "sorts before"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadShardIndex(bytes.NewReader(tc.b), int64(len(tc.b)))
			if !errors.Is(err, ErrShardFormat) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReadShardIndex = %v, want ErrShardFormat mentioning %q", err, tc.want)
			}
		})
	}
	if _, err := ReadShardIndex(bytes.NewReader(good), MaxShardBytes+1); !errors.Is(err, ErrShardFormat) {
		t.Errorf("size beyond MaxShardBytes: %v", err)
	}
	// A declared size larger than the reader's data: a truncated read.
	if _, err := ReadShardIndex(bytes.NewReader(good[:20]), int64(len(good))); !errors.Is(err, ErrShardFormat) {
		t.Errorf("reader shorter than size: %v", err)
	}
}

func TestValidKey(t *testing.T) {
	for _, k := range []string{"a", "a.go", "src/net/http/server.go", "a..b", ".hidden", "x/.y", "с/文.go", "a\\b", strings.Repeat("k", MaxKeyBytes)} {
		if !ValidKey(k) {
			t.Errorf("ValidKey(%q) = false", k)
		}
	}
	for _, k := range []string{"", ".", "..", "/a", "a/", "a//b", "./a", "a/./b", "a/..", "../a", "a\x00", "\xc3", strings.Repeat("k", MaxKeyBytes+1)} {
		if ValidKey(k) {
			t.Errorf("ValidKey(%q) = true", k)
		}
	}
}

func TestShardKey(t *testing.T) {
	h := strings.Repeat("0123456789abcdef", 4)
	if k := ShardKey(h); k != "shard/"+h {
		t.Fatalf("ShardKey = %q", k)
	}
	if got, ok := ParseShardKey(ShardKey(h)); !ok || got != h {
		t.Fatalf("ParseShardKey(ShardKey(h)) = %q, %v", got, ok)
	}
	for _, k := range []string{"", "shard/", "shard/" + h[:63], "shard/" + h + "0", "shard/" + strings.ToUpper(h), "state/" + h, "shard/" + h[:63] + "g", "shard//" + h[1:]} {
		if got, ok := ParseShardKey(k); ok {
			t.Errorf("ParseShardKey(%q) = %q, true", k, got)
		}
	}
}

func TestShardInfoValidate(t *testing.T) {
	h := strings.Repeat("ab", 32)
	good := ShardInfo{Hash: h, Bytes: 100, Files: 2}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []ShardInfo{
		{Hash: h[:62], Bytes: 100, Files: 1},
		{Hash: strings.ToUpper(h), Bytes: 100, Files: 1},
		{Hash: h, Bytes: 23, Files: 1},
		{Hash: h, Bytes: MaxShardBytes + 1, Files: 1},
		{Hash: h, Bytes: 100, Files: 0},
		{Hash: h, Bytes: 100, Files: 9},
		{Hash: h, Bytes: MaxShardBytes, Files: MaxShardFiles + 1},
	} {
		if err := bad.Validate(); !errors.Is(err, ErrShardFormat) {
			t.Errorf("%+v.Validate() = %v, want ErrShardFormat", bad, err)
		}
	}
}

func FuzzShardIndex(f *testing.F) {
	f.Add(shardBytes([]string{"a"}, [][]byte{{'x'}}))
	f.Add(shardBytes([]string{"a.go", "b/c.go", "b/c.go"}, [][]byte{[]byte("package a"), []byte("c"), []byte("cc")}))
	f.Add(shardBytes([]string{"é/ü", "z"}, [][]byte{bytes.Repeat([]byte{0}, 300), {1}}))
	f.Add([]byte(ShardMagic))
	f.Add([]byte("SKSHARD1\xff\xff\xff\xff"))
	f.Add(append(shardBytes([]string{"a"}, [][]byte{{'x'}}), 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		idx, err := ReadShardIndex(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			if !errors.Is(err, ErrShardFormat) {
				t.Fatalf("error %v does not wrap ErrShardFormat", err)
			}
			return
		}
		// An accepted shard re-encodes to the same bytes, and its files tile
		// the data region exactly.
		keys := make([]string, len(idx.Files))
		sizes := make([]int64, len(idx.Files))
		for i, sf := range idx.Files {
			if !ValidKey(sf.Key) || sf.Size < 1 || (i > 0 && sf.Key < keys[i-1]) {
				t.Fatalf("accepted file %d: %+v", i, sf)
			}
			keys[i], sizes[i] = sf.Key, sf.Size
		}
		h := appendShardHeader(nil, keys, sizes)
		if !bytes.Equal(h, b[:len(h)]) {
			t.Fatalf("header re-encodes differently")
		}
		off := int64(len(h))
		for i, sf := range idx.Files {
			if sf.Offset != off {
				t.Fatalf("file %d at %d, want %d", i, sf.Offset, off)
			}
			off += sf.Size
		}
		if off != int64(len(b)) || idx.Size != int64(len(b)) {
			t.Fatalf("files end at %d, shard is %d (index says %d)", off, len(b), idx.Size)
		}
	})
}
