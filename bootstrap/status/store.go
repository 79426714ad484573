package status

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/skein-ml/skein/telemetry"
)

// Sentinel errors of the store.
var (
	// ErrConfig: a StoreConfig field is out of range (the message names it).
	ErrConfig = errors.New("status: invalid store config")
	// ErrBadPeer: a peer ID is empty, longer than 128 bytes or not printable ASCII.
	ErrBadPeer = errors.New("status: invalid peer id")
	// ErrBadEvent: an event's kind is not join, leave or fail.
	ErrBadEvent = errors.New("status: invalid event")
	// ErrStale: a report is older than everything kept for its peer or its
	// round, and the store is at its cap there.
	ErrStale = errors.New("status: report older than the kept history")
	// ErrRoundAhead: a report's round is more than MaxRoundLead rounds past
	// the run's certified round (or, with no recent certified round, past
	// the round of the other current reporters).
	ErrRoundAhead = errors.New("status: report round too far ahead of the run")
	// ErrTooManyTokens: a report claims more tokens than MaxRoundTokens.
	ErrTooManyTokens = errors.New("status: report claims more tokens than a round allows")
	// ErrClosed: the store is closed.
	ErrClosed = errors.New("status: store closed")
	// ErrSchema: the file was written by an incompatible version.
	ErrSchema = errors.New("status: unknown history schema")
)

// StoreConfig bounds what the store keeps. See the package documentation.
type StoreConfig struct {
	MaxReportsPerPeer int           // reports kept per peer, lowest rounds evicted first
	MaxPeers          int           // peers kept, least recently seen evicted first
	MaxRounds         int           // per-round aggregates kept, lowest rounds evicted first
	MaxEvents         int           // membership events kept, oldest evicted first
	MaxRoundLead      uint64        // refuse reports further ahead of the run's certified round
	MaxRoundTokens    uint64        // refuse reports of more tokens (what the manifest allows a member per round); 0: no limit
	Fresh             time.Duration // a peer's latest report is current for max(Fresh, 2 x its round's wall time)
	NoSync            bool          // skip fsync (tests); a crash may lose the last writes
	// Certified, if set, returns the state hash that round's certificate
	// carries (ok false while it has none: then the stand-in rule of
	// Store.certify judges). It is called under the store's lock when a
	// report for the round arrives, so it must be fast and must not call
	// the store.
	Certified func(round uint64) (hash uint64, ok bool)
}

// DefaultStoreConfig keeps 128 reports for each of 2048 peers, 100,000
// rounds, 10,000 events; a report is current for 5 minutes (or two of its
// rounds) and may lead the run's certified round by 2 rounds (reports of a
// round arrive before the others of the round before have finished).
func DefaultStoreConfig() StoreConfig {
	return StoreConfig{MaxReportsPerPeer: 128, MaxPeers: 2048, MaxRounds: 100_000, MaxEvents: 10_000,
		MaxRoundLead: 2, Fresh: 5 * time.Minute}
}

// Validate names the first invalid field.
func (c StoreConfig) Validate() error {
	switch {
	case c.MaxReportsPerPeer < 1 || c.MaxReportsPerPeer > 1<<20:
		return fmt.Errorf("%w: max reports per peer %d out of range [1, 2^20]", ErrConfig, c.MaxReportsPerPeer)
	case c.MaxPeers < 1 || c.MaxPeers > 1<<20:
		return fmt.Errorf("%w: max peers %d out of range [1, 2^20]", ErrConfig, c.MaxPeers)
	case c.MaxRounds < 1 || c.MaxRounds > 1<<24:
		return fmt.Errorf("%w: max rounds %d out of range [1, 2^24]", ErrConfig, c.MaxRounds)
	case c.MaxEvents < 1 || c.MaxEvents > 1<<24:
		return fmt.Errorf("%w: max events %d out of range [1, 2^24]", ErrConfig, c.MaxEvents)
	case c.MaxRoundLead < 1:
		return fmt.Errorf("%w: max round lead %d must be positive", ErrConfig, c.MaxRoundLead)
	case c.Fresh <= 0:
		return fmt.Errorf("%w: fresh window %v must be positive", ErrConfig, c.Fresh)
	}
	return nil
}

// Kinds of membership events.
const (
	Join  = "join"
	Leave = "leave"
	Fail  = "fail"
)

// Event is a membership change seen by the bootstrap.
type Event struct {
	At     time.Time // when the bootstrap saw it; zero means now
	Peer   string    // libp2p peer ID
	Kind   string    // Join, Leave or Fail
	Role   string    // the member's role from its metadata, may be empty
	Device string    // the member's device from its metadata, may be empty
}

// RoundStats is the aggregate of one outer round over the reports received
// for it (GET /api/history).
type RoundStats struct {
	Round        uint64    `json:"round"`
	First        time.Time `json:"first"`        // first report received for the round
	Last         time.Time `json:"last"`         // last report received for the round
	Reporters    int       `json:"reporters"`    // reports for the round
	Contributors int       `json:"contributors"` // of which trained (not adopted)
	// Certified: the round has a certified state; the losses and tokens
	// below count the reporters that ended the round in it, and are absent
	// (0) until it has one.
	Certified    bool     `json:"certified"`
	TrainLoss    *float64 `json:"train_loss,omitempty"`    // median over those contributors that reported one
	ValLoss      *float64 `json:"val_loss,omitempty"`      // median over those reporters that measured it
	ValReporters int      `json:"val_reporters"`           // reporters that measured validation loss
	Tokens       uint64   `json:"tokens"`                  // tokens those reporters trained in the round
	BytesSent    uint64   `json:"bytes_sent"`              // bytes sent by the reporters
	BytesRecv    uint64   `json:"bytes_recv"`              // bytes received by the reporters
	MajorityHash string   `json:"majority_hash,omitempty"` // state hash of a strict majority of the votes, 16 hex digits
	HashVotes    int      `json:"hash_votes"`              // reports that carried a state hash
	// MajorityVotes is how many of them carried MajorityHash (0 if none):
	// HashVotes - MajorityVotes members ended the round with another state.
	MajorityVotes int `json:"majority_votes"`
	// Data is the lower median of the data progress of those reporters in
	// the certified state that reported one (a run over a packed dataset);
	// absent if none did.
	Data *DataProgress `json:"data,omitempty"`
	// BitsPerParam is the median over the round's contributors (sampled,
	// certified or not) of 8 x bytes sent / the model's parameters, 4
	// decimals; absent when none contributed or the parameter count is
	// unknown. The store does not know the parameter count: Store.History
	// leaves it absent and the Server's GET /api/history fills it in.
	BitsPerParam *float64 `json:"bits_per_param,omitempty"`

	sent *float64 // the median bytes sent behind BitsPerParam, nil for none
}

// setParams fills in BitsPerParam for a model of params parameters.
func (r *RoundStats) setParams(params int) {
	if r.sent != nil {
		r.BitsPerParam = bitsPerParam(*r.sent, params)
	}
}

// Bucket and key names of the bbolt file.
var (
	bucketMeta    = []byte("meta")
	bucketPeers   = []byte("peers")   // peer ID -> peerRecord
	bucketReports = []byte("reports") // peer ID -> bucket: round (8 bytes BE) -> report
	bucketRounds  = []byte("rounds")  // round (8 bytes BE) -> roundRecord
	bucketEvents  = []byte("events")  // sequence (8 bytes BE) -> eventRecord
	keySchema     = []byte("schema")
	keyTotals     = []byte("totals")
)

const (
	schemaVersion = "1"
	maxHashes     = 8   // distinct state hashes kept per round; more go to "other"
	maxSamples    = 16  // reports per round whose values are kept for the medians
	eventsInMem   = 100 // latest events mirrored in memory for snapshots
)

// report is one sanitized report as stored.
type report struct {
	At             int64   `json:"at"` // bootstrap clock, unix ms
	Round          uint64  `json:"round"`
	StateHash      uint64  `json:"hash,omitempty"`
	Adopted        bool    `json:"adopted,omitempty"`
	Train          float64 `json:"train,omitempty"`
	HasTrain       bool    `json:"has_train,omitempty"`
	Val            float64 `json:"val,omitempty"`
	HasVal         bool    `json:"has_val,omitempty"`
	Tokens         uint64  `json:"tokens,omitempty"`
	TokensPerSec   float64 `json:"tps,omitempty"`
	BytesSent      uint64  `json:"sent,omitempty"`
	BytesRecv      uint64  `json:"recv,omitempty"`
	ComputeSeconds float64 `json:"compute_s,omitempty"`
	WallSeconds    float64 `json:"wall_s,omitempty"`
	Members        int     `json:"members,omitempty"`
	Device         string  `json:"device,omitempty"`
	Version        string  `json:"version,omitempty"`
	SentMS         int64   `json:"sent_ms,omitempty"` // the volunteer's clock
	// HasData, Epoch and EpochTrained: the volunteer's data progress (a
	// run over a packed dataset; absent in reports stored before it).
	HasData      bool    `json:"has_data,omitempty"`
	Epoch        uint64  `json:"epoch,omitempty"`
	EpochTrained float64 `json:"epoch_trained,omitempty"`
}

// dpUnits is the report's share of fp32 data-parallel traffic, in units of
// InnerSteps x 8 x ParamCount bytes: ring all-reduce sends 2(M-1)/M x 4P bytes
// per worker per step.
func (r *report) dpUnits() float64 {
	if r.Adopted || r.Members < 2 {
		return 0
	}
	return float64(r.Members-1) / float64(r.Members)
}

// peerRecord is what the store knows about one peer.
type peerRecord struct {
	First     int64  `json:"first"` // unix ms
	Last      int64  `json:"last"`  // unix ms
	Kept      int    `json:"kept"`  // reports in its bucket
	Reports   uint64 `json:"reports"`
	Tokens    uint64 `json:"tokens"`
	BytesSent uint64 `json:"sent"`
	BytesRecv uint64 `json:"recv"`
	Role      string `json:"role,omitempty"` // from its latest membership event
	Gone      int64  `json:"gone,omitempty"` // unix ms of its last leave or failure
	Latest    report `json:"latest"`
}

type hashVote struct {
	Hash  uint64 `json:"h"`
	Votes int    `json:"n"`
}

// sample is what one report adds to its round's curve point: its state
// and its values (a loss of -1: not measured; Data false: no data
// progress, as in every sample stored before it was kept; Contrib false:
// its bytes sent do not count, being an adopted report's or stored before
// they were kept).
type sample struct {
	Hash    uint64  `json:"h,omitempty"`
	Train   float32 `json:"t"`
	Val     float32 `json:"v"`
	Tokens  uint64  `json:"k,omitempty"`
	Data    bool    `json:"d,omitempty"`
	Epoch   uint64  `json:"e,omitempty"`
	Trained float32 `json:"p,omitempty"` // share of the epoch
	Contrib bool    `json:"c,omitempty"` // a contributor's (not adopted): Sent counts for bits per parameter
	Sent    uint64  `json:"s,omitempty"` // bytes sent, a contributor's only
}

func (r *report) sample() sample {
	x := sample{Hash: r.StateHash, Train: -1, Val: -1, Tokens: r.Tokens}
	if !r.Adopted {
		x.Contrib, x.Sent = true, r.BytesSent
	}
	if r.HasTrain {
		x.Train = float32(r.Train)
	}
	if r.HasVal {
		x.Val = float32(r.Val)
	}
	if r.HasData {
		x.Data, x.Epoch, x.Trained = true, r.Epoch, float32(r.EpochTrained)
	}
	return x
}

// roundRecord is the stored aggregate of one round; counts and sums, so
// that a replaced report can be taken out again, and the values of the
// first maxSamples reports for the medians.
type roundRecord struct {
	Round        uint64     `json:"round"`
	First        int64      `json:"first"`
	Last         int64      `json:"last"`
	Reporters    int        `json:"reporters"`
	Contributors int        `json:"contributors"`
	TrainN       int        `json:"train_n"`
	ValN         int        `json:"val_n"`
	BytesSent    uint64     `json:"sent"`
	BytesRecv    uint64     `json:"recv"`
	DPUnits      float64    `json:"dp_units"`
	Hashes       []hashVote `json:"hashes,omitempty"`
	OtherHashes  int        `json:"other_hashes,omitempty"`
	Samples      []sample   `json:"samples,omitempty"`
	// Certified and CertHash: the round's certified state as last judged
	// (Store.certify), when a report for the round arrived.
	Certified bool   `json:"certified,omitempty"`
	CertHash  uint64 `json:"cert_hash,omitempty"`
}

func (rr *roundRecord) apply(r *report, sign int) {
	f := float64(sign)
	rr.Reporters += sign
	if !r.Adopted {
		rr.Contributors += sign
	}
	if r.HasTrain {
		rr.TrainN += sign
	}
	if r.HasVal {
		rr.ValN += sign
	}
	rr.DPUnits = max(rr.DPUnits+f*r.dpUnits(), 0)
	switch x := r.sample(); {
	case sign < 0:
		i := slices.Index(rr.Samples, x)
		if i < 0 { // a sample stored before bytes sent were kept
			x.Contrib, x.Sent = false, 0
			i = slices.Index(rr.Samples, x)
		}
		if i >= 0 {
			rr.Samples = slices.Delete(rr.Samples, i, i+1)
		}
	case len(rr.Samples) < maxSamples:
		rr.Samples = append(rr.Samples, x)
	}
	if sign > 0 {
		rr.BytesSent = addSat(rr.BytesSent, r.BytesSent)
		rr.BytesRecv = addSat(rr.BytesRecv, r.BytesRecv)
		if rr.First == 0 || r.At < rr.First {
			rr.First = r.At
		}
		rr.Last = max(rr.Last, r.At)
	} else {
		rr.BytesSent = subFloor(rr.BytesSent, r.BytesSent)
		rr.BytesRecv = subFloor(rr.BytesRecv, r.BytesRecv)
	}
	if r.StateHash == 0 {
		return
	}
	i := slices.IndexFunc(rr.Hashes, func(v hashVote) bool { return v.Hash == r.StateHash })
	switch {
	case i >= 0:
		rr.Hashes[i].Votes += sign
		if rr.Hashes[i].Votes <= 0 {
			rr.Hashes = slices.Delete(rr.Hashes, i, i+1)
		}
	case sign > 0 && len(rr.Hashes) < maxHashes:
		rr.Hashes = append(rr.Hashes, hashVote{r.StateHash, 1})
	default:
		rr.OtherHashes = max(rr.OtherHashes+sign, 0)
	}
}

// votes counts the reports of the round that carried hash (0: none).
func (rr *roundRecord) votes(hash uint64) int {
	n := rr.Reporters - rr.OtherHashes
	for _, v := range rr.Hashes {
		if v.Hash == hash {
			return v.Votes
		}
		n -= v.Votes
	}
	if hash != 0 {
		return 0
	}
	return n
}

// majority returns the hash that a strict majority of the votes carry, and
// how many votes it has of how many.
func (rr *roundRecord) majority() (hash uint64, votes, of int, ok bool) {
	of = rr.OtherHashes
	for _, v := range rr.Hashes {
		of += v.Votes
	}
	for _, v := range rr.Hashes {
		if 2*v.Votes > of {
			return v.Hash, v.Votes, of, true
		}
	}
	return 0, 0, of, false
}

func (rr *roundRecord) stats() RoundStats {
	p := rr.point()
	s := RoundStats{Round: rr.Round, First: msTime(rr.First), Last: msTime(rr.Last),
		Reporters: rr.Reporters, Contributors: rr.Contributors, Certified: rr.Certified, ValReporters: rr.ValN,
		TrainLoss: lossPtr(p.Train), ValLoss: lossPtr(p.Val), Tokens: p.Tokens, BytesSent: rr.BytesSent, BytesRecv: rr.BytesRecv,
		Data: p.data()}
	if !math.IsNaN(float64(p.Sent)) {
		s.sent = ptr(float64(p.Sent))
	}
	h, votes, of, ok := rr.majority()
	s.HashVotes = of
	if ok {
		s.MajorityHash, s.MajorityVotes = hashHex(h), votes
	}
	return s
}

// point is the in-memory mirror of a round, for the loss curve and the
// totals: what the reporters in the round's certified state say (nothing
// while it has none). Train and Val are NaN when none of them measured it;
// HasData is false when none of them reported data progress. Sent is the
// median bytes sent by the round's sampled contributors, whatever their
// state (certified or not), NaN when there is none.
type point struct {
	Round     uint64
	Last      int64
	Train     float64 // median
	Val       float64 // median
	Tokens    uint64  // sum
	Epoch     uint64  // with Trained: the lower median of the (epoch, trained) pairs
	Reporters int32
	Trained   float32
	Sent      float32 // median
	Certified bool
	HasData   bool
}

// bitsPerParam is p's bits sent per parameter for a model of params
// parameters, nil without one.
func (p *point) bitsPerParam(params int) *float64 {
	return bitsPerParam(float64(p.Sent), params)
}

// data is p's data progress as served, nil without one.
func (p *point) data() *DataProgress {
	if !p.HasData {
		return nil
	}
	return &DataProgress{Epoch: p.Epoch, Trained: math.Round(float64(p.Trained)*1e4) / 1e4}
}

func (rr *roundRecord) point() point {
	p := point{Round: rr.Round, Last: rr.Last, Train: math.NaN(), Val: math.NaN(),
		Reporters: int32(rr.Reporters), Certified: rr.Certified}
	var sent []float64
	for _, x := range rr.Samples {
		if x.Contrib {
			sent = append(sent, float64(x.Sent))
		}
	}
	p.Sent = float32(median(sent))
	if !rr.Certified {
		return p
	}
	var train, val []float64
	var data []sample
	n := 0
	for _, x := range rr.Samples {
		if x.Hash != rr.CertHash {
			continue
		}
		n++
		p.Tokens = addSat(p.Tokens, x.Tokens)
		if x.Train >= 0 {
			train = append(train, float64(x.Train))
		}
		if x.Val >= 0 {
			val = append(val, float64(x.Val))
		}
		if x.Data {
			data = append(data, x)
		}
	}
	if len(data) > 0 {
		m := medianProgress(data)
		p.Epoch, p.Trained, p.HasData = m.Epoch, m.Trained, true
	}
	// Reporters past maxSamples count at the sampled ones' mean.
	if all := rr.votes(rr.CertHash); all > n && n > 0 {
		p.Tokens = satUint(float64(p.Tokens) / float64(n) * float64(all))
	}
	p.Train, p.Val = median(train), median(val)
	return p
}

type totals struct {
	Reports   uint64  `json:"reports"`
	Tokens    uint64  `json:"tokens"`
	BytesSent uint64  `json:"sent"`
	BytesRecv uint64  `json:"recv"`
	DPUnits   float64 `json:"dp_units"`
}

type eventRecord struct {
	At     int64  `json:"at"`
	Peer   string `json:"peer"`
	Kind   string `json:"kind"`
	Role   string `json:"role,omitempty"`
	Device string `json:"device,omitempty"`
}

// Store is the run's durable, bounded history. It is safe for concurrent
// use; writes are serialized.
type Store struct {
	cfg StoreConfig
	db  *bolt.DB

	mu      sync.Mutex
	closed  bool
	peers   map[string]*peerRecord
	rounds  []point // sorted by round
	events  []eventRecord
	nEvents int
	totals  totals
	refused uint64
	// attempts is each peer's latest reported round, refused or not, and
	// when (in memory, at most MaxPeers): a run whose members all jump
	// ahead together (a staged run skipping iterations after a re-plan)
	// moves its reference round with them, a lone liar does not.
	attempts map[string]attempt
	gen      uint64
	changed  chan struct{}
}

// Open opens (or creates) the history file at path and loads its mirror. If
// cfg's bounds are lower than what the file holds, the excess is evicted now.
func Open(path string, cfg StoreConfig) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second, NoSync: cfg.NoSync})
	if err != nil {
		return nil, fmt.Errorf("status: open history %s: %w", path, err)
	}
	s := &Store{cfg: cfg, db: db, peers: make(map[string]*peerRecord), changed: make(chan struct{})}
	if err := db.Update(s.load); err != nil {
		db.Close()
		return nil, fmt.Errorf("status: load history %s: %w", path, err)
	}
	return s, nil
}

// load creates the buckets, checks the schema, fills the mirror and applies
// the bounds.
func (s *Store) load(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketMeta, bucketPeers, bucketReports, bucketRounds, bucketEvents} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return err
		}
	}
	meta := tx.Bucket(bucketMeta)
	switch v := meta.Get(keySchema); {
	case v == nil:
		if err := meta.Put(keySchema, []byte(schemaVersion)); err != nil {
			return err
		}
	case string(v) != schemaVersion:
		return fmt.Errorf("%w: %q, want %q", ErrSchema, v, schemaVersion)
	}
	if v := meta.Get(keyTotals); v != nil {
		if err := json.Unmarshal(v, &s.totals); err != nil {
			return fmt.Errorf("totals: %w", err)
		}
	}
	if err := tx.Bucket(bucketPeers).ForEach(func(k, v []byte) error {
		rec := new(peerRecord)
		if err := json.Unmarshal(v, rec); err != nil {
			return fmt.Errorf("peer %q: %w", k, err)
		}
		s.peers[string(k)] = rec
		return nil
	}); err != nil {
		return err
	}
	for len(s.peers) > s.cfg.MaxPeers {
		if err := s.evictPeer(tx, s.leastRecentPeer("")); err != nil {
			return err
		}
	}
	for id, rec := range s.peers {
		if rec.Kept > s.cfg.MaxReportsPerPeer {
			if err := s.trimReports(tx, id, rec); err != nil {
				return err
			}
			if err := putJSON(tx.Bucket(bucketPeers), []byte(id), rec); err != nil {
				return err
			}
		}
	}
	rounds := tx.Bucket(bucketRounds)
	if err := rounds.ForEach(func(k, v []byte) error {
		var rr roundRecord
		if err := json.Unmarshal(v, &rr); err != nil {
			return fmt.Errorf("round %d: %w", beUint(k), err)
		}
		s.rounds = append(s.rounds, rr.point())
		return nil
	}); err != nil {
		return err
	}
	if n := len(s.rounds) - s.cfg.MaxRounds; n > 0 {
		for _, p := range s.rounds[:n] {
			if err := rounds.Delete(beKey(p.Round)); err != nil {
				return err
			}
		}
		s.rounds = slices.Clone(s.rounds[n:])
	}
	events := tx.Bucket(bucketEvents)
	s.nEvents = events.Stats().KeyN
	if err := s.trimEvents(events); err != nil {
		return err
	}
	c := events.Cursor()
	for k, v := c.Last(); k != nil && len(s.events) < eventsInMem; k, v = c.Prev() {
		var e eventRecord
		if err := json.Unmarshal(v, &e); err != nil {
			return fmt.Errorf("event %d: %w", beUint(k), err)
		}
		s.events = append(s.events, e)
	}
	slices.Reverse(s.events)
	return nil
}

// Close closes the file. Later calls return ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.closed = true
	close(s.changed) // wake the waiters one last time
	return s.db.Close()
}

// Changed returns a channel that is closed at the next change of the
// history (or when the store closes).
func (s *Store) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// generation counts the changes so far.
func (s *Store) generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// Refused counts the reports that Record refused since Open.
func (s *Store) Refused() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

// notifyLocked wakes the waiters on Changed; s.mu is held.
func (s *Store) notifyLocked() {
	s.gen++
	close(s.changed)
	s.changed = make(chan struct{})
}

// Record adds the report that peer sent for one round, received at the
// bootstrap's time at. A second report for the same (peer, round) replaces
// the first in every aggregate. It returns ErrBadPeer, ErrStale,
// ErrRoundAhead, ErrTooManyTokens or ErrClosed for reports it refuses (each
// counted in Refused), or a wrapped disk error.
func (s *Store) Record(peer string, rep telemetry.Report, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	err := s.record(peer, rep, at)
	if err != nil {
		if errors.Is(err, ErrBadPeer) || errors.Is(err, ErrStale) || errors.Is(err, ErrRoundAhead) || errors.Is(err, ErrTooManyTokens) {
			s.refused++
		}
		return err
	}
	s.notifyLocked()
	return nil
}

func (s *Store) record(peer string, rep telemetry.Report, at time.Time) error {
	if !ValidPeerID(peer) {
		return fmt.Errorf("%w: %q", ErrBadPeer, cleanString(peer, maxPeerIDLength))
	}
	if lim := s.cfg.MaxRoundTokens; lim > 0 && rep.Tokens > lim {
		return fmt.Errorf("%w: %d tokens in round %d from %s, at most %d", ErrTooManyTokens, rep.Tokens, rep.Round, ShortID(peer), lim)
	}
	r := sanitize(rep, at.UnixMilli())
	others := s.freshRounds(at, peer)
	ref, ok := s.certifiedRound(at)
	if !ok && len(others) > 0 {
		ref, ok = majorityRound(others), true
	}
	if ok {
		ref = max(ref, s.attempted(peer, r.Round, at))
	}
	if ok && r.Round > ref && r.Round-ref > s.cfg.MaxRoundLead {
		return fmt.Errorf("%w: round %d from %s, run at %d (lead at most %d)", ErrRoundAhead, r.Round, ShortID(peer), ref, s.cfg.MaxRoundLead)
	}
	i, found := s.findRound(r.Round)
	if !found && len(s.rounds) >= s.cfg.MaxRounds && i == 0 {
		return fmt.Errorf("%w: round %d from %s, oldest kept round %d", ErrStale, r.Round, ShortID(peer), s.rounds[0].Round)
	}

	// Work on copies; the mirror changes only after the commit.
	old := s.peers[peer]
	rec := &peerRecord{First: r.At}
	if old != nil {
		c := *old
		rec = &c
	}
	var (
		rr      roundRecord
		evicted string
		tot     = s.totals
		dropped int   // rounds evicted from the front
		was, pt point // the round's point before and after the report
	)
	if found {
		was = s.rounds[i]
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		reports, err := tx.Bucket(bucketReports).CreateBucketIfNotExists([]byte(peer))
		if err != nil {
			return err
		}
		key := beKey(r.Round)
		var prev *report
		if v := reports.Get(key); v != nil {
			prev = new(report)
			if err := json.Unmarshal(v, prev); err != nil {
				return fmt.Errorf("report %s/%d: %w", ShortID(peer), r.Round, err)
			}
		} else if rec.Kept >= s.cfg.MaxReportsPerPeer {
			if k, _ := reports.Cursor().First(); k != nil && beUint(k) > r.Round {
				return fmt.Errorf("%w: round %d from %s, oldest kept %d", ErrStale, r.Round, ShortID(peer), beUint(k))
			}
		}
		if err := putJSON(reports, key, &r); err != nil {
			return err
		}
		if prev == nil {
			rec.Kept++
		}
		if rec.Kept > s.cfg.MaxReportsPerPeer {
			if err := s.trimReports(tx, peer, rec); err != nil {
				return err
			}
		}

		rounds := tx.Bucket(bucketRounds)
		rr = roundRecord{Round: r.Round}
		if v := rounds.Get(key); v != nil {
			if err := json.Unmarshal(v, &rr); err != nil {
				return fmt.Errorf("round %d: %w", r.Round, err)
			}
		}
		if prev != nil {
			rr.apply(prev, -1)
		}
		rr.apply(&r, +1)
		rr.CertHash, rr.Certified = s.certify(&rr, len(others)+1)
		pt = rr.point()
		if err := putJSON(rounds, key, &rr); err != nil {
			return err
		}
		if !found && len(s.rounds)+1 > s.cfg.MaxRounds {
			dropped = len(s.rounds) + 1 - s.cfg.MaxRounds
			for _, p := range s.rounds[:dropped] {
				if err := rounds.Delete(beKey(p.Round)); err != nil {
					return err
				}
			}
		}

		tot.Reports++
		tot.Tokens = addSat(subFloor(tot.Tokens, was.Tokens), pt.Tokens)
		if prev != nil {
			tot.BytesSent = subFloor(tot.BytesSent, prev.BytesSent)
			tot.BytesRecv = subFloor(tot.BytesRecv, prev.BytesRecv)
			tot.DPUnits = max(tot.DPUnits-prev.dpUnits(), 0)
			rec.Tokens = subFloor(rec.Tokens, prev.Tokens)
			rec.BytesSent = subFloor(rec.BytesSent, prev.BytesSent)
			rec.BytesRecv = subFloor(rec.BytesRecv, prev.BytesRecv)
		}
		tot.BytesSent = addSat(tot.BytesSent, r.BytesSent)
		tot.BytesRecv = addSat(tot.BytesRecv, r.BytesRecv)
		tot.DPUnits += r.dpUnits()
		if err := putJSON(tx.Bucket(bucketMeta), keyTotals, &tot); err != nil {
			return err
		}

		rec.Reports++
		rec.Tokens = addSat(rec.Tokens, r.Tokens)
		rec.BytesSent = addSat(rec.BytesSent, r.BytesSent)
		rec.BytesRecv = addSat(rec.BytesRecv, r.BytesRecv)
		rec.Last = max(rec.Last, r.At)
		rec.Latest = r
		if err := putJSON(tx.Bucket(bucketPeers), []byte(peer), rec); err != nil {
			return err
		}
		if old == nil && len(s.peers) >= s.cfg.MaxPeers {
			evicted = s.leastRecentPeer(peer)
			return s.deletePeer(tx, evicted)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrStale) {
			return err
		}
		return fmt.Errorf("status: record %s round %d: %w", ShortID(peer), r.Round, err)
	}

	s.totals = tot
	s.peers[peer] = rec
	if evicted != "" {
		delete(s.peers, evicted)
	}
	if found {
		s.rounds[i] = pt
	} else {
		s.rounds = slices.Insert(s.rounds, i, pt)
		if dropped > 0 {
			s.rounds = slices.Delete(s.rounds, 0, dropped)
		}
	}
	return nil
}

// findRound returns the index of round in the mirror, or where it would go.
func (s *Store) findRound(round uint64) (int, bool) {
	return slices.BinarySearchFunc(s.rounds, round, func(p point, r uint64) int {
		switch {
		case p.Round < r:
			return -1
		case p.Round > r:
			return 1
		}
		return 0
	})
}

// trimReports evicts the lowest rounds of peer's reports down to the cap.
func (s *Store) trimReports(tx *bolt.Tx, peer string, rec *peerRecord) error {
	b := tx.Bucket(bucketReports).Bucket([]byte(peer))
	if b == nil {
		rec.Kept = 0
		return nil
	}
	c := b.Cursor()
	for k, _ := c.First(); k != nil && rec.Kept > s.cfg.MaxReportsPerPeer; k, _ = c.First() {
		if err := b.Delete(k); err != nil {
			return err
		}
		rec.Kept--
	}
	return nil
}

// leastRecentPeer returns the peer seen longest ago, other than except.
func (s *Store) leastRecentPeer(except string) string {
	var id string
	var last int64
	for p, rec := range s.peers {
		if p != except && (id == "" || rec.Last < last || rec.Last == last && p < id) {
			id, last = p, rec.Last
		}
	}
	return id
}

// deletePeer removes a peer and its reports from the file.
func (s *Store) deletePeer(tx *bolt.Tx, peer string) error {
	if err := tx.Bucket(bucketPeers).Delete([]byte(peer)); err != nil {
		return err
	}
	if err := tx.Bucket(bucketReports).DeleteBucket([]byte(peer)); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
		return err
	}
	return nil
}

// evictPeer removes a peer from the file and the mirror.
func (s *Store) evictPeer(tx *bolt.Tx, peer string) error {
	if err := s.deletePeer(tx, peer); err != nil {
		return err
	}
	delete(s.peers, peer)
	return nil
}

// RecordEvent adds a membership event. Role and Device are cleaned and cut
// to telemetry.MaxString bytes.
func (s *Store) RecordEvent(e Event) error {
	if !ValidPeerID(e.Peer) {
		return fmt.Errorf("%w: %q", ErrBadPeer, cleanString(e.Peer, maxPeerIDLength))
	}
	if e.Kind != Join && e.Kind != Leave && e.Kind != Fail {
		return fmt.Errorf("%w: kind %q, want join, leave or fail", ErrBadEvent, cleanString(e.Kind, 16))
	}
	if e.At.IsZero() {
		e.At = time.Now()
	}
	rec := eventRecord{At: e.At.UnixMilli(), Peer: e.Peer, Kind: e.Kind,
		Role: cleanString(e.Role, telemetry.MaxString), Device: cleanString(e.Device, telemetry.MaxString)}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	var peer *peerRecord
	if p := s.peers[e.Peer]; p != nil && (rec.Role != "" || e.Kind != Join) {
		c := *p
		c.Role = cmp.Or(rec.Role, c.Role)
		if e.Kind != Join {
			c.Gone = rec.At // its last report no longer counts it in the run
		}
		peer = &c
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEvents)
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		if err := putJSON(b, beKey(seq), &rec); err != nil {
			return err
		}
		s.nEvents++
		if err := s.trimEvents(b); err != nil {
			return err
		}
		if peer != nil {
			return putJSON(tx.Bucket(bucketPeers), []byte(e.Peer), peer)
		}
		return nil
	})
	if err != nil {
		// nEvents may be off by what the failed transaction counted; recount.
		_ = s.db.View(func(tx *bolt.Tx) error { s.nEvents = tx.Bucket(bucketEvents).Stats().KeyN; return nil })
		return fmt.Errorf("status: record event %s %s: %w", e.Kind, ShortID(e.Peer), err)
	}
	if peer != nil {
		s.peers[e.Peer] = peer
	}
	s.events = append(s.events, rec)
	if n := len(s.events) - eventsInMem; n > 0 {
		s.events = slices.Delete(s.events, 0, n)
	}
	s.notifyLocked()
	return nil
}

// trimEvents evicts the oldest events down to the cap.
func (s *Store) trimEvents(b *bolt.Bucket) error {
	c := b.Cursor()
	for k, _ := c.First(); k != nil && s.nEvents > s.cfg.MaxEvents; k, _ = c.First() {
		if err := b.Delete(k); err != nil {
			return err
		}
		s.nEvents--
	}
	return nil
}

// History returns the aggregates of up to limit rounds from fromRound on,
// in round order.
func (s *Store) History(fromRound uint64, limit int) ([]RoundStats, error) {
	// A read transaction runs beside the writer; s.mu is not held across it,
	// so a slow reader of the public API never holds up Record (bbolt's
	// Close waits for open reads).
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	out := []RoundStats{}
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketRounds).Cursor()
		for k, v := c.Seek(beKey(fromRound)); k != nil && len(out) < limit; k, v = c.Next() {
			var rr roundRecord
			if err := json.Unmarshal(v, &rr); err != nil {
				return fmt.Errorf("round %d: %w", beUint(k), err)
			}
			out = append(out, rr.stats())
		}
		return nil
	})
	return out, err
}

// Events returns up to limit of the latest membership events (at most 100),
// newest first.
func (s *Store) Events(limit int) []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Event, 0, min(limit, len(s.events)))
	for i := len(s.events) - 1; i >= 0 && len(out) < limit; i-- {
		e := s.events[i]
		out = append(out, Event{At: msTime(e.At), Peer: e.Peer, Kind: e.Kind, Role: e.Role, Device: e.Device})
	}
	return out
}

// roundRecords reads the stored aggregates of the given rounds; s.mu is held.
func (s *Store) roundRecords(rounds []uint64) (map[uint64]*roundRecord, error) {
	out := make(map[uint64]*roundRecord, len(rounds))
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRounds)
		for _, r := range rounds {
			if _, ok := out[r]; ok {
				continue
			}
			v := b.Get(beKey(r))
			if v == nil {
				continue
			}
			rr := new(roundRecord)
			if err := json.Unmarshal(v, rr); err != nil {
				return fmt.Errorf("round %d: %w", r, err)
			}
			out[r] = rr
		}
		return nil
	})
	return out, err
}

// fresh reports whether the peer's latest report is current at now (ms): at
// most max(Fresh, 2 x its wall time, capped at an hour) old.
func (s *Store) fresh(rec *peerRecord, now int64) bool {
	window := max(s.cfg.Fresh, 2*time.Duration(min(rec.Latest.WallSeconds, 3600)*float64(time.Second)))
	age := now - rec.Latest.At
	return age >= -time.Minute.Milliseconds() && age <= window.Milliseconds()
}

// freshRounds returns the latest rounds of the peers (other than except)
// whose latest report is current at at and that have not left or failed
// since it (a volunteer that goes on alone after the others left must
// still certify its rounds).
func (s *Store) freshRounds(at time.Time, except string) []uint64 {
	now := at.UnixMilli()
	var rounds []uint64
	for id, rec := range s.peers {
		if id != except && s.fresh(rec, now) && rec.Gone < rec.Latest.At {
			rounds = append(rounds, rec.Latest.Round)
		}
	}
	return rounds
}

// certify returns the state of rr's round that the run certified: the
// round certificate's hash (StoreConfig.Certified) or, for a round without
// one (the bootstrap has not followed it yet, NoLoCo and staged runs), the
// hash that a strict majority of the round's reporters announced, counted
// against the current reporters when there are more of them (current: the
// run's size as the store sees it), so that one
// reporter alone in a round certifies nothing in a run of several. Hash 0
// (NoLoCo and staged members hold no common state) is a hash like any
// other here, so those runs are certified by their majority too.
func (s *Store) certify(rr *roundRecord, current int) (uint64, bool) {
	if s.cfg.Certified != nil {
		if h, ok := s.cfg.Certified(rr.Round); ok {
			return h, true
		}
	}
	n := max(rr.Reporters, current)
	if 2*rr.votes(0) > n {
		return 0, true
	}
	for _, v := range rr.Hashes {
		if 2*v.Votes > n {
			return v.Hash, true
		}
	}
	return 0, false
}

// certifiedRound is the highest round with a certified state, if its last
// report is current at at (the bound of a run that went quiet lapses).
func (s *Store) certifiedRound(at time.Time) (uint64, bool) {
	for i := len(s.rounds) - 1; i >= 0; i-- {
		if p := s.rounds[i]; p.Certified {
			return p.Round, at.UnixMilli()-p.Last <= s.cfg.Fresh.Milliseconds()
		}
	}
	return 0, false
}

// majorityRound returns the highest round that more than half of rounds
// reach: one volunteer far ahead cannot move it.
func majorityRound(rounds []uint64) uint64 {
	sort.Slice(rounds, func(i, j int) bool { return rounds[i] > rounds[j] })
	return rounds[len(rounds)/2]
}

func putJSON(b *bolt.Bucket, key []byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(key, data)
}

func beKey(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func beUint(k []byte) uint64 {
	if len(k) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(k)
}

func msTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

func hashHex(h uint64) string { return fmt.Sprintf("%016x", h) }

func ptr[T any](v T) *T { return &v }

type attempt struct {
	round uint64
	at    int64 // unix ms
}

// attempted records peer's report of round and returns the round that a
// strict majority (at least two) of the peers with a recent report, this
// one included, have reported at least: refused reports count, so members
// that all moved ahead are followed; 0 when no such majority is ahead.
func (s *Store) attempted(peer string, round uint64, at time.Time) uint64 {
	now := at.UnixMilli()
	if s.attempts == nil {
		s.attempts = map[string]attempt{}
	}
	if _, ok := s.attempts[peer]; !ok && len(s.attempts) >= s.cfg.MaxPeers {
		for id, a := range s.attempts { // forget the oldest
			if now-a.at > s.cfg.Fresh.Milliseconds() {
				delete(s.attempts, id)
			}
		}
		if len(s.attempts) >= s.cfg.MaxPeers {
			return 0
		}
	}
	s.attempts[peer] = attempt{round, now}
	var rounds []uint64
	for _, a := range s.attempts {
		if now-a.at <= s.cfg.Fresh.Milliseconds() {
			rounds = append(rounds, a.round)
		}
	}
	if len(rounds) < 2 {
		return 0
	}
	return majorityRound(rounds)
}
