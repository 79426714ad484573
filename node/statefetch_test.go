package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
	"github.com/skein-ml/skein/transport"
)

// The served index decodes back to the round and the chunk hashes the
// state hash is made of, and every malformed header is refused by name.
func TestServedIndex(t *testing.T) {
	const n = 3
	phi, mom := []float32{1, 2, 3}, []float32{4, 5, 6}
	blob, root := encodeServed(7, phi, mom)
	if root != optimizer.StateHashOf(7, phi, mom) {
		t.Fatal("the served root is not the state hash")
	}
	if int64(len(blob)) != servedSize(n) {
		t.Fatalf("%d bytes, servedSize says %d", len(blob), servedSize(n))
	}
	idx := blob[:servedIndexSize(n)]
	round, chunks, err := parseServedIndex(idx, n)
	if err != nil || round != 7 || optimizer.StateRoot(round, n, chunks) != root {
		t.Fatalf("round %d, err %v", round, err)
	}
	set := func(off int, v uint32) []byte {
		b := slices.Clone(idx)
		binary.LittleEndian.PutUint32(b[off:], v)
		return b
	}
	tests := []struct {
		name string
		b    []byte
		n    int
		want string
	}{
		{"short", idx[:len(idx)-1], n, "index of"},
		{"other model", idx, n + 1<<20, "index of"},
		{"magic", set(0, 0), n, "magic"},
		{"version", set(4, 1), n, "version"},
		{"parameters", set(16, 4), n, "parameters"},
		{"chunk size", set(24, 4096), n, "chunks of"},
		{"chunk count", set(28, 2), n, "chunks, want"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := parseServedIndex(tt.b, tt.n)
			if !errors.Is(err, ErrBadState) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want ErrBadState naming %q", err, tt.want)
			}
		})
	}
}

func FuzzServedIndex(f *testing.F) {
	blob, _ := encodeServed(3, []float32{1, 2}, []float32{3, 4})
	f.Add(blob[:servedIndexSize(2)], 2)
	f.Add([]byte("SKSI"), 1)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > 1<<20 {
			return // the caller's model: never a size the sender chose
		}
		if _, chunks, err := parseServedIndex(b, n); err == nil && len(chunks) != optimizer.StateChunks(n) {
			t.Fatalf("%d chunks for %d parameters", len(chunks), n)
		}
	})
}

func TestParseStateKey(t *testing.T) {
	tests := []struct {
		key          string
		round        uint64
		latest, isOK bool
	}{
		{stateKey, 0, true, true},
		{stateKeyAt(42), 42, false, true},
		{stateKey + "@", 0, false, false},
		{stateKey + "@-1", 0, false, false},
		{stateKey + "@99999999999999999999999", 0, false, false},
		{"shard-abc", 0, false, false},
	}
	for _, tt := range tests {
		r, latest, ok := parseStateKey(tt.key)
		if r != tt.round || latest != tt.latest || ok != tt.isOK {
			t.Errorf("%q: (%d, %v, %v), want (%d, %v, %v)", tt.key, r, latest, ok, tt.round, tt.latest, tt.isOK)
		}
	}
}

// logRecorder keeps the Warn records a download logs.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecorder) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.Key + "=" + a.Value.String())
		return true
	})
	l.mu.Lock()
	l.msgs = append(l.msgs, b.String())
	l.mu.Unlock()
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// A state of several chunks is taken from several members at once, each
// chunk checked against the index: a member that serves one forged chunk
// is named in the log and the chunk is taken from another member; a member
// that has moved on to another round serves nothing of this one; and the
// state installed is bit for bit the one the run announces.
func TestFetchStateChunks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	sw := p2ptest.NewSwarm(t, 5, p2ptest.Options{})
	me := sw.Nodes[1]
	honest1, liar, movedOn, honest2 := sw.Nodes[2], sw.Nodes[3], sw.Nodes[4], sw.Nodes[0]
	n := 3*optimizer.StateChunkBytes/8 + 1000 // 4 chunks, the last one short
	phi, mom := make([]float32, n), make([]float32, n)
	for i := range phi {
		phi[i], mom[i] = float32(i%97)/97, float32(i%31)/-31
	}
	good, want := encodeServed(5, phi, mom)
	forged := slices.Clone(good)
	chunk1 := servedIndexSize(n) + optimizer.StateChunkBytes
	forged[chunk1+8] ^= 1 // one bit of chunk 1 (the liar's span), under an honest index
	later, _ := encodeServed(6, phi, mom)
	serve := func(node *p2p.Node, s servedState) {
		node.ServeBulk(func(_ context.Context, _ peer.ID, key string) (io.ReaderAt, int64, error) {
			return s.open(key)
		}, 0)
	}
	serve(honest1, servedState{good, 5})
	serve(honest2, servedState{good, 5})
	serve(liar, servedState{forged, 5})
	serve(movedOn, servedState{later, 6})
	id := func(n *p2p.Node) transport.PeerID { return transport.PeerID(n.ID().String()) }

	rec := &logRecorder{}
	// The liar's and the moved-on member's spans fail the check; the
	// repair takes them from the others.
	ids := []transport.PeerID{id(honest1), id(liar), id(movedOn), id(honest2)}
	round, gotPhi, gotMom, from, err := fetchVerifiedState(context.Background(), me, slog.New(rec), n, 5, want, ids, nil)
	if err != nil {
		t.Fatal(err)
	}
	if round != 5 || from != id(honest1) || optimizer.StateHashOf(round, gotPhi, gotMom) != want {
		t.Fatalf("round %d from %s: not the announced state", round, from)
	}
	rec.mu.Lock()
	logged := strings.Join(rec.msgs, "\n")
	rec.mu.Unlock()
	if !strings.Contains(logged, "offender="+liar.ID().String()) || !strings.Contains(logged, "chunk=1") {
		t.Fatalf("the forged chunk's server is not named:\n%s", logged)
	}
	if strings.Contains(logged, movedOn.ID().String()) {
		t.Fatalf("a member that moved on is blamed:\n%s", logged)
	}

	// Only the liar and a member at another round: nothing intact.
	_, _, _, _, err = fetchVerifiedState(context.Background(), me, nil, n, 5, want, []transport.PeerID{id(liar), id(movedOn)}, nil)
	if !errors.Is(err, ErrBadState) || !strings.Contains(err.Error(), "1 of 4 chunks") {
		t.Fatalf("err %v, want ErrBadState with chunk 1 missing", err)
	}
	// The index is checked against the announced hash before anything else.
	_, _, _, _, err = fetchVerifiedState(context.Background(), me, nil, n, 5, want^1, ids[:1], nil)
	if !errors.Is(err, ErrBadState) || !strings.Contains(err.Error(), "the run announces") {
		t.Fatalf("err %v, want the announced hash refused", err)
	}
	// A hash names a state of one round: a vote for round 5 naming the
	// true hash of a round-6 state (a sybil's) takes nothing.
	_, laterHash := encodeServed(6, phi, mom)
	_, _, _, _, err = fetchVerifiedState(context.Background(), me, nil, n, 5, laterHash, []transport.PeerID{id(movedOn)}, nil)
	if !errors.Is(err, ErrBadState) || !strings.Contains(err.Error(), "for a certificate of round 5") {
		t.Fatalf("err %v, want a round-6 state refused for round 5", err)
	}
	// Without an announced hash (NoLoCo) the first index is followed.
	round, _, _, from, err = fetchVerifiedState(context.Background(), me, nil, n, 6, 0, ids, nil)
	if err != nil || round != 6 || from != id(movedOn) {
		t.Fatalf("round %d from %s, err %v: want round 6 from the member at 6", round, from, err)
	}
	// Without one, each member holds its own state: the body comes only
	// from the member whose index was taken, and when that member moves
	// on mid-download (it refuses its round's key) or serves a bad chunk,
	// the next member's state is taken whole, not patched with chunks of
	// another state.
	racer := sw.Nodes[0]
	racer.ServeBulk(func(_ context.Context, _ peer.ID, key string) (io.ReaderAt, int64, error) {
		if _, latest, _ := parseStateKey(key); !latest {
			return nil, 0, errors.New("moved on")
		}
		return bytes.NewReader(later), int64(len(later)), nil
	}, 0)
	rec = &logRecorder{}
	round, gotPhi, _, from, err = fetchVerifiedState(context.Background(), me, slog.New(rec), n, 5, 0, []transport.PeerID{id(racer), id(liar), id(honest1)}, nil)
	if err != nil || round != 5 || from != id(honest1) || !slices.Equal(gotPhi, phi) {
		t.Fatalf("round %d from %s, err %v: want honest1's state whole", round, from, err)
	}
	// The liar's chunk did not match its own index: that, and only that,
	// is blamed.
	logged = strings.Join(rec.msgs, "\n")
	if strings.Contains(logged, racer.ID().String()) || !strings.Contains(logged, "offender="+liar.ID().String()) {
		t.Fatalf("want the liar blamed, not the member that moved on:\n%s", logged)
	}
	// Nobody can serve its state whole: the last failure is reported.
	_, _, _, _, err = fetchVerifiedState(context.Background(), me, nil, n, 5, 0, []transport.PeerID{id(racer), id(liar)}, nil)
	if !errors.Is(err, ErrBadState) {
		t.Fatalf("err %v, want ErrBadState", err)
	}
}

// The chunk hashes of the served body are those the state hash is made of.
func TestServedChunksMatchIndex(t *testing.T) {
	n := optimizer.StateChunkBytes/8 + 3
	phi, mom := make([]float32, n), make([]float32, n)
	for i := range phi {
		phi[i] = float32(i)
	}
	blob, _ := encodeServed(1, phi, mom)
	_, chunks, err := parseServedIndex(blob[:servedIndexSize(n)], n)
	if err != nil {
		t.Fatal(err)
	}
	body := blob[servedIndexSize(n):]
	for c := range chunks {
		if sha256.Sum256(body[c*optimizer.StateChunkBytes:min((c+1)*optimizer.StateChunkBytes, len(body))]) != chunks[c] {
			t.Fatalf("chunk %d", c)
		}
	}
	if p, _, err := decodeBody(body, n); err != nil || !slices.Equal(p, phi) {
		t.Fatalf("body does not decode back: %v", err)
	}
}

// A state's tail (a dataset run's ledger) is part of the hash the run
// announces: a member serving the honest index and body with another tail
// is refused and named, and the tail is taken from an honest member.
func TestFetchStateTail(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	sw := p2ptest.NewSwarm(t, 3, p2ptest.Options{})
	me, liar, honest := sw.Nodes[0], sw.Nodes[1], sw.Nodes[2]
	n := 1000
	phi, mom := make([]float32, n), make([]float32, n)
	for i := range phi {
		phi[i], mom[i] = float32(i)/float32(n), -1
	}
	tail := []byte("the ledger of round 5")
	good, want := encodeServedWith(5, phi, mom, tail)
	if plain, h := encodeServed(5, phi, mom); h == want || len(plain) != len(good)-len(tail) {
		t.Fatal("the tail does not change the state's hash")
	}
	forged := slices.Clone(good)
	forged[len(forged)-1] ^= 1
	for node, blob := range map[*p2p.Node][]byte{liar: forged, honest: good} {
		s := servedState{blob, 5}
		node.ServeBulk(func(_ context.Context, _ peer.ID, key string) (io.ReaderAt, int64, error) { return s.open(key) }, 0)
	}
	id := func(n *p2p.Node) transport.PeerID { return transport.PeerID(n.ID().String()) }
	rec := &logRecorder{}
	_, _, _, got, _, err := fetchVerifiedStateTail(context.Background(), me, slog.New(rec), n, 5, want, []transport.PeerID{id(liar), id(honest)}, nil)
	if err != nil || string(got) != string(tail) {
		t.Fatalf("tail %q, err %v", got, err)
	}
	rec.mu.Lock()
	logged := strings.Join(rec.msgs, "\n")
	rec.mu.Unlock()
	if !strings.Contains(logged, "offender="+liar.ID().String()) {
		t.Fatalf("the forged tail's server is not named:\n%s", logged)
	}
	if _, _, _, _, _, err := fetchVerifiedStateTail(context.Background(), me, nil, n, 5, want, []transport.PeerID{id(liar)}, nil); !errors.Is(err, ErrBadState) {
		t.Fatalf("only the liar: %v", err)
	}
}

// TestServedBlobReuse: a volunteer encodes each new state into the blob
// it served before, but never while a download still reads that blob.
func TestServedBlobReuse(t *testing.T) {
	const n = 5000
	phi := make([]float32, n)
	d, err := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, phi)
	if err != nil {
		t.Fatal(err)
	}
	v := &Volunteer{dl: d}
	state := func(round uint64) { // a new round's state, as apply leaves it
		for i := range d.Phi {
			d.Phi[i] = float32(round) + float32(i)*1e-3
		}
		d.Round = round
		d.Touch()
		v.serveDiLoCo()
	}
	read := func(r io.ReaderAt) []byte {
		b := make([]byte, servedSize(n))
		if _, err := r.ReadAt(b, 0); err != nil && err != io.EOF {
			t.Fatal(err)
		}
		return b
	}
	state(1)
	r1, _, err := v.openServed(stateKey)
	if err != nil {
		t.Fatal(err)
	}
	want1 := read(r1)
	first := &v.served.blob[0]
	state(2) // round 1's blob becomes the spare, still being read
	// A download of round 1 that began before round 2 goes on from it.
	r1b, _, err := v.openServed(stateKeyAt(1))
	if err != nil {
		t.Fatalf("round 1 after round 2: %v", err)
	}
	if !bytes.Equal(read(r1b), want1) {
		t.Fatal("the previous round's blob served other bytes")
	}
	r1b.(io.Closer).Close()
	if _, _, err := v.openServed(stateKeyAt(0)); err == nil {
		t.Fatal("served a round it no longer holds")
	}
	state(3) // round 3 cannot take round 1's blob: r1 still reads it
	if got := read(r1); !bytes.Equal(got, want1) {
		t.Fatal("a blob being downloaded was overwritten")
	}
	if &v.served.blob[0] == first {
		t.Fatal("round 3 was encoded into a blob still being read")
	}
	r1.(io.Closer).Close()
	r1.(io.Closer).Close() // a second Close counts once
	if _, _, err := v.openServed(stateKeyAt(1)); err == nil {
		t.Fatal("served round 1 two rounds later")
	}
	state(4) // round 2's blob, read by nobody, is the spare now
	state(5) // round 3's
	state(6) // round 4's
	if v.served.readers.Load() != 0 || v.spare.readers.Load() != 0 {
		t.Fatalf("readers %d, spare's %d", v.served.readers.Load(), v.spare.readers.Load())
	}
	second := &v.served.blob[0]
	state(7)
	state(8)
	if &v.served.blob[0] != second {
		t.Fatal("a free spare was not reused")
	}
	r8, _, err := v.openServed(stateKeyAt(8))
	if err != nil {
		t.Fatal(err)
	}
	defer r8.(io.Closer).Close()
	round, chunks, err := parseServedIndex(read(r8)[:servedIndexSize(n)], n)
	if err != nil || round != 8 || optimizer.StateRoot(8, n, chunks) != d.StateHash() {
		t.Fatalf("round %d, err %v, root matches %v", round, err, err == nil && optimizer.StateRoot(8, n, chunks) == d.StateHash())
	}
	if want, _ := encodeServed(8, d.Phi, d.Mom); !bytes.Equal(read(r8), want) {
		t.Fatal("the reused blob differs from a fresh encoding")
	}
}
