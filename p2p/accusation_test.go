package p2p

import (
	"bytes"
	"compress/lzw"
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"slices"
	"strings"
	"testing"
	"time"
)

// Packets as memberlist v0.7.0 encodes them (go-msgpack v2.1.5's
// MsgpackHandle, memberlist's encode, makeCompoundMessage, compressPayload
// and rawSendMsgPacket's CRC), produced once by a program using those
// libraries. Names are peer IDs A and B below.
const (
	realA = "12D3KooWGzxzKZYveHXtpG6AsrUJBcWxHBFS2HsEoGTxrMLvkXtf"
	realB = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"
	// dead{Incarnation: 7, Node: A, From: B}
	realDead = "0583a446726f6dda0034313244334b6f6f574a576f61715a6844616f454673684637526831627059396f68696846687a6357366436394c72324e41537571ab496e6361726e6174696f6e07a44e6f6465da0034313244334b6f6f57477a787a4b5a597665485874704736417372554a4263577848424653324873456f475478724d4c766b587466"
	// suspect{Incarnation: 70000, Node: B, From: A}
	realSuspect = "0383a446726f6dda0034313244334b6f6f57477a787a4b5a597665485874704736417372554a4263577848424653324873456f475478724d4c766b587466ab496e6361726e6174696f6ece00011170a44e6f6465da0034313244334b6f6f574a576f61715a6844616f454673684637526831627059396f68696846687a6357366436394c72324e41537571"
	// CRC, compressed, compound of a ping, the dead and the suspect.
	realCompressed = "0cef297c590982a4416c676f00a3427566da0157000f0c00500ac021008b001422e5e40d9932da00d0882183c88c256fde5c39a2078f9e255ab2d82983040b1d38476c049923a78a122163aee04122c4c8141948e6147973840a1e394d98d85963d24ca92965e2341ca06aca9b3a72c6940942868c1c527f000008d0f469d4320d1f469c58f162c62b4aaebc0913470b1a2261de143132078d911b52d0c41003274b8e3768d2d845a327a60d323672309123c349902975e274852a15ca1b39749a3d00556010292372deb4194bd122468d69d7b67d1b776eddbb79f7f6fd1b7870e12b87132f6efc38f2aa246ec68491e3260c9d346fdc1c60e810a2c4d2663572f408522449932855b2740953264d9b3875f2f4095428513a660678062d9a74d9d31b3b7e0c39b2e4c9942b5bbe8c39b3e6cd9c3bf5f453504315f55b70c315775c72ce6c15011ccc89f5dc7b67a5c6965b70c945975d78e9c5975f80096604618621a618638e41164740"
	// CRC, compound of a ping and the suspect.
	realCompound = "0c19cd8533070200a5008b0085a44e6f6465da0034313244334b6f6f57477a787a4b5a597665485874704736417372554a4263577848424653324873456f475478724d4c766b587466a55365714e6f03aa536f7572636541646472a47f000001aa536f757263654e6f6465da0034313244334b6f6f574a576f61715a6844616f454673684637526831627059396f68696846687a6357366436394c72324e41537571aa536f75726365506f7274cd0fa00383a446726f6dda0034313244334b6f6f57477a787a4b5a597665485874704736417372554a4263577848424653324873456f475478724d4c766b587466ab496e6361726e6174696f6ece00011170a44e6f6465da0034313244334b6f6f574a576f61715a6844616f454673684637526831627059396f68696846687a6357366436394c72324e41537571"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// encodeAccusation is a suspect or dead message as memberlist encodes it.
func encodeAccusation(dead bool, node, from string, inc uint32) []byte {
	typ := byte(msgSuspect)
	if dead {
		typ = msgDead
	}
	b := []byte{typ, 0x83}
	b = append(b, mpStr("Incarnation")...)
	b = binary.BigEndian.AppendUint32(append(b, 0xce), inc)
	b = append(append(b, mpStr("Node")...), mpStr(node)...)
	return append(append(b, mpStr("From")...), mpStr(from)...)
}

func compound(parts ...[]byte) []byte {
	b := []byte{msgCompound, byte(len(parts))}
	for _, p := range parts {
		b = binary.BigEndian.AppendUint16(b, uint16(len(p)))
	}
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func compressed(t testing.TB, in []byte) []byte {
	var z bytes.Buffer
	w := lzw.NewWriter(&z, lzw.LSB, 8)
	if _, err := w.Write(in); err != nil {
		t.Fatal(err)
	}
	w.Close()
	b := []byte{msgCompress, 0x82}
	b = append(append(b, mpStr("Algo")...), 0)
	b = append(b, mpStr("Buf")...)
	b = binary.BigEndian.AppendUint32(append(b, 0xc6), uint32(z.Len()))
	return append(b, z.Bytes()...)
}

func withCRC(in []byte) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{msgHasCRC}, crc32.ChecksumIEEE(in)), in...)
}

func TestParseAccusations(t *testing.T) {
	deadAB := accusation{dead: true, node: realA, from: realB, incarnation: 7}
	suspBA := accusation{node: realB, from: realA, incarnation: 70000}
	badCRC := unhex(t, realCompound)
	badCRC[1] ^= 1
	nested := encodeAccusation(true, "x", "y", 1)
	for range maxAccuseDepth - 1 {
		nested = compressed(t, nested)
	}
	tooDeep := compressed(t, nested)
	many := make([][]byte, 2*maxAccusations)
	for i := range many {
		many[i] = encodeAccusation(false, "n", "f", uint32(i))
	}
	array := append([]byte{msgDead, 0x93, 0x05}, append(mpStr("n"), 0xc0)...) // [5, "n", nil]
	extra := []byte{msgSuspect, 0x84, 0xa3, 'V', 's', 'n', 0xcb, 0, 0, 0, 0, 0, 0, 0, 0,
		0xa4, 'N', 'o', 'd', 'e', 0xa1, 'n', 0xa4, 'N', 'o', 'd', 'e', 0xa1, 'm', 0xa4, 'F', 'r', 'o', 'm', 0xc4, 1, 'f'}
	cases := []struct {
		name string
		pkt  []byte
		want []accusation
	}{
		{"memberlist dead", unhex(t, realDead), []accusation{deadAB}},
		{"memberlist suspect", unhex(t, realSuspect), []accusation{suspBA}},
		{"memberlist crc compressed compound", unhex(t, realCompressed), []accusation{deadAB, suspBA}},
		{"memberlist crc compound", unhex(t, realCompound), []accusation{suspBA}},
		{"bad crc: memberlist drops it", badCRC, nil},
		{"hand encoded", encodeAccusation(true, "a", strings.Repeat("f", 40), 1<<31), []accusation{{dead: true, node: "a", from: strings.Repeat("f", 40), incarnation: 1 << 31}}},
		{"array form, nil field", array, []accusation{{dead: true, node: "n", incarnation: 5}}},
		{"unknown field skipped, last repeat wins, bin string", extra, []accusation{{node: "m", from: "f"}}},
		{"nested to the limit", nested, []accusation{{dead: true, node: "x", from: "y", incarnation: 1}}},
		{"nested past the limit", tooDeep, nil},
		{"truncated part ends a compound", compound(encodeAccusation(true, "a", "b", 1), encodeAccusation(true, "c", "d", 2))[:40], []accusation{{dead: true, node: "a", from: "b", incarnation: 1}}},
		{"at most maxAccusations", compound(many...), func() (w []accusation) {
			for i := range maxAccusations {
				w = append(w, accusation{node: "n", from: "f", incarnation: uint32(i)})
			}
			return w
		}()},
		{"lzw bomb", compressed(t, make([]byte, 4*maxInflated)), nil},
		{"incarnation past uint32", []byte{msgDead, 0x81, 0xab, 'I', 'n', 'c', 'a', 'r', 'n', 'a', 't', 'i', 'o', 'n', 0xcf, 0, 0, 0, 1, 0, 0, 0, 0}, nil},
		{"negative incarnation", []byte{msgDead, 0x81, 0xab, 'I', 'n', 'c', 'a', 'r', 'n', 'a', 't', 'i', 'o', 'n', 0xff}, nil},
		{"node not a string", []byte{msgDead, 0x81, 0xa4, 'N', 'o', 'd', 'e', 0x01}, nil},
		{"nested map", []byte{msgDead, 0x81, 0xa4, 'N', 'o', 'd', 'e', 0x80}, nil},
		{"empty", nil, nil},
		{"ping", []byte{0, 0x80}, nil},
		{"huge map length", []byte{msgDead, 0xdf, 0xff, 0xff, 0xff, 0xff}, nil},
		{"huge string length", []byte{msgDead, 0x81, 0xdb, 0xff, 0xff, 0xff, 0xff}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := slices.Clone(c.pkt)
			got := parseAccusations(in)
			if !slices.Equal(got, c.want) {
				t.Errorf("got %+v\nwant %+v", got, c.want)
			}
			if !bytes.Equal(in, c.pkt) {
				t.Error("the packet was modified")
			}
		})
	}
}

func FuzzParseAccusations(f *testing.F) {
	for _, s := range []string{realDead, realSuspect, realCompressed, realCompound} {
		b, _ := hex.DecodeString(s)
		f.Add(b)
	}
	f.Add(compound(encodeAccusation(true, "a", "b", 1), []byte{msgDead, 0x93, 0x05, 0xc0, 0xc0}))
	f.Add(compressed(f, encodeAccusation(false, "a", "b", 1)))
	f.Fuzz(func(t *testing.T, in []byte) {
		orig := slices.Clone(in)
		got := parseAccusations(in)
		if len(got) > maxAccusations {
			t.Fatalf("%d accusations, bound %d", len(got), maxAccusations)
		}
		if !bytes.Equal(in, orig) {
			t.Fatal("the packet was modified")
		}
	})
}

func TestAccusationsBounded(t *testing.T) {
	a := newAccusations()
	ids := randPeers(t, 2*maxAccused)
	via := ids[0]
	t0 := time.Now()
	for i, id := range ids {
		a.record(t0, via, []accusation{{dead: true, node: id.String(), from: "f"}, {node: "not a peer ID", from: "f"}})
		if len(a.by) > maxAccused {
			t.Fatalf("after %d records %d accused, bound %d", i+1, len(a.by), maxAccused)
		}
	}
	// Per member: the last accusationsPerPeer distinct (kind, accuser,
	// sender), a repeat refreshed in place; long accusers truncated.
	a = newAccusations()
	id := ids[1]
	for i := range 2 * accusationsPerPeer {
		a.record(t0.Add(time.Duration(i)*time.Millisecond), via, []accusation{{dead: true, node: id.String(), from: strings.Repeat("x", i+maxAccuserLen)}})
	}
	a.record(t0.Add(time.Second), via, []accusation{{dead: true, node: id.String(), from: strings.Repeat("x", maxAccuserLen), incarnation: 9}})
	got := a.about(id, t0.Add(2*time.Second))
	if len(got) != 1 || !strings.Contains(got[0], "incarnation 9") || !strings.Contains(got[0], via.String()) {
		t.Fatalf("accusations of %s: %q, want the one truncated accuser, refreshed", id, got)
	}
	for i := range 2 * accusationsPerPeer {
		a.record(t0, ids[i], []accusation{{node: id.String(), from: "f"}})
	}
	if got := a.about(id, t0); len(got) != accusationsPerPeer {
		t.Fatalf("%d accusations kept of %s, want %d", len(got), id, accusationsPerPeer)
	}
	// Expiry: nothing older than accuseTTL is reported or kept.
	if got := a.about(id, t0.Add(accuseTTL+2*time.Second)); len(got) != 0 {
		t.Fatalf("expired accusations reported: %q", got)
	}
	a.expire(t0.Add(accuseTTL + 2*time.Second))
	if len(a.by) != 0 {
		t.Fatalf("%d accused kept past accuseTTL", len(a.by))
	}
}
