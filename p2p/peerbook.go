package p2p

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/skein-ml/skein/internal/atomicfile"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// PeerBookFile is the name of the persisted peer list inside a data directory.
const PeerBookFile = "peers.json"

// MaxPeerBookSize is the most peers a peer book keeps, in memory and in
// peers.json, and the default of NodeConfig.PeerBookSize. Rejoining without
// the bootstrap needs only a few reachable peers, and a node dials all the
// candidates at once; 256 matches the connections a node is sized for
// (DefaultLimits' ConnHigh) and, at 8 addresses of at most 256 bytes each,
// keeps the file (about 0.6 MiB at worst) under its 1 MiB bound.
const MaxPeerBookSize = 256

// Bounds of the peer book, applied when reading it back.
const (
	maxPeerBookBytes = 1 << 20
	maxPeerBookPeers = MaxPeerBookSize
	maxPeerAddrs     = 8
	maxAddrLen       = 256
)

// PeerRecord is a peer this node has seen, kept so the node can rejoin
// through any known member when the bootstrap is down.
type PeerRecord struct {
	ID       peer.ID
	Addrs    []ma.Multiaddr
	Role     Role
	LastSeen time.Time
}

type peerRecordJSON struct {
	ID    string   `json:"id"`
	Addrs []string `json:"addrs"`
	Role  uint8    `json:"role"`
	Seen  int64    `json:"seen"` // unix seconds
}

type peerBookJSON struct {
	Version int              `json:"version"`
	Peers   []peerRecordJSON `json:"peers"`
}

// EncodePeerBook serialises records (most recent first, at most 256).
func EncodePeerBook(recs []PeerRecord) ([]byte, error) {
	recs = append([]PeerRecord(nil), recs...)
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].LastSeen.After(recs[j].LastSeen) })
	if len(recs) > maxPeerBookPeers {
		recs = recs[:maxPeerBookPeers]
	}
	out := peerBookJSON{Version: 1, Peers: make([]peerRecordJSON, 0, len(recs))}
	for _, r := range recs {
		j := peerRecordJSON{ID: r.ID.String(), Role: uint8(r.Role), Seen: r.LastSeen.Unix()}
		for i, a := range r.Addrs {
			if i == maxPeerAddrs {
				break
			}
			j.Addrs = append(j.Addrs, a.String())
		}
		out.Peers = append(out.Peers, j)
	}
	return json.MarshalIndent(out, "", " ")
}

// DecodePeerBook parses a peer book. It is bounded (1 MiB, 256 peers, 8
// addresses of 256 bytes each) and never panics; unparsable addresses are
// dropped, an unparsable peer ID fails the whole book.
func DecodePeerBook(b []byte) ([]PeerRecord, error) {
	if len(b) > maxPeerBookBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrBadPeerBook, len(b), maxPeerBookBytes)
	}
	var in peerBookJSON
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadPeerBook, err)
	}
	if in.Version != 1 {
		return nil, fmt.Errorf("%w: version %d, want 1", ErrBadPeerBook, in.Version)
	}
	if len(in.Peers) > maxPeerBookPeers {
		return nil, fmt.Errorf("%w: %d peers, limit %d", ErrBadPeerBook, len(in.Peers), maxPeerBookPeers)
	}
	out := make([]PeerRecord, 0, len(in.Peers))
	for _, j := range in.Peers {
		id, err := peer.Decode(j.ID)
		if err != nil {
			return nil, fmt.Errorf("%w: peer id %q: %w", ErrBadPeerBook, j.ID, err)
		}
		if len(j.Addrs) > maxPeerAddrs {
			return nil, fmt.Errorf("%w: peer %s has %d addresses, limit %d", ErrBadPeerBook, id, len(j.Addrs), maxPeerAddrs)
		}
		r := PeerRecord{ID: id, Role: Role(j.Role), LastSeen: time.Unix(j.Seen, 0)}
		for _, s := range j.Addrs {
			if len(s) > maxAddrLen {
				continue
			}
			if a, err := ma.NewMultiaddr(s); err == nil {
				r.Addrs = append(r.Addrs, a)
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// peerBook is the in-memory, persisted set of peers seen. Every member that
// joins is put, so it holds at most max records, the most recently seen: a
// long-running seed sees many short-lived peers.
type peerBook struct {
	path  string // "" = not persisted
	max   int    // NodeConfig.PeerBookSize
	mu    sync.Mutex
	recs  map[peer.ID]PeerRecord
	dirty bool
}

// loadPeerBook reads dir's peer book, keeping the max most recently seen.
func loadPeerBook(dir string, max int) (*peerBook, error) {
	pb := &peerBook{max: max, recs: make(map[peer.ID]PeerRecord)}
	if dir == "" {
		return pb, nil
	}
	pb.path = filepath.Join(dir, PeerBookFile)
	f, err := os.Open(pb.path)
	if errors.Is(err, fs.ErrNotExist) {
		return pb, nil
	}
	if err != nil {
		return nil, fmt.Errorf("p2p: peer book: %w", err)
	}
	defer f.Close()
	b := make([]byte, maxPeerBookBytes+1)
	n, _ := readFull(f, b)
	recs, err := DecodePeerBook(b[:n])
	if err != nil {
		return nil, fmt.Errorf("p2p: peer book %s: %w", pb.path, err)
	}
	for _, r := range recs {
		pb.putLocked(r)
	}
	return pb, nil
}

func readFull(f *os.File, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := f.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (pb *peerBook) put(r PeerRecord) {
	pb.mu.Lock()
	if pb.putLocked(r) {
		pb.dirty = true
	}
	pb.mu.Unlock()
}

// putLocked adds or replaces r. A new peer in a full book replaces the least
// recently seen record, unless r is older still. It reports whether the book
// changed.
func (pb *peerBook) putLocked(r PeerRecord) bool {
	if _, ok := pb.recs[r.ID]; !ok && len(pb.recs) >= pb.max {
		var oldest peer.ID
		var seen time.Time
		found := false
		for id, o := range pb.recs {
			if !found || o.LastSeen.Before(seen) {
				oldest, seen, found = id, o.LastSeen, true
			}
		}
		if !found || r.LastSeen.Before(seen) {
			return false
		}
		delete(pb.recs, oldest)
	}
	pb.recs[r.ID] = r
	return true
}

// list returns records, most recently seen first.
func (pb *peerBook) list() []PeerRecord {
	pb.mu.Lock()
	out := make([]PeerRecord, 0, len(pb.recs))
	for _, r := range pb.recs {
		out = append(out, r)
	}
	pb.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].LastSeen.After(out[j].LastSeen) })
	return out
}

// save writes the book if it changed (temporary file, then rename).
func (pb *peerBook) save() error {
	if pb.path == "" {
		return nil
	}
	pb.mu.Lock()
	if !pb.dirty {
		pb.mu.Unlock()
		return nil
	}
	pb.dirty = false
	pb.mu.Unlock()
	b, err := EncodePeerBook(pb.list())
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(pb.path, b, 0o600); err != nil {
		return fmt.Errorf("p2p: peer book: %w", err)
	}
	return nil
}
