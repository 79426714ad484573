package status

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/skein-ml/skein/telemetry"
)

// RunInfo describes the run. The bootstrap knows it from the manifest and
// gives it to NewServer; none of it comes from volunteers.
type RunInfo struct {
	RunID          string
	ManifestHash   string // hex; the page shows its first 12 characters
	Preset         string // model preset name
	ParamCount     int    // parameters of the model
	InnerSteps     int    // H, inner steps per outer round
	Optimizer      string // outer optimizer kind, e.g. "diloco"
	BootstrapAddrs []string
	Started        time.Time
}

// Member is a live member of the run as the bootstrap's gossip sees it.
type Member struct {
	Peer      string // libp2p peer ID
	Role      string
	Device    string
	Round     uint64 // the round its gossiped state hash belongs to
	StateHash uint64 // 0 when it has not gossiped one
}

// Agreement of a member's state hash with the majority of its round.
const (
	Agree   = "agree"   // equal to the hash of a strict majority of the round's votes
	Differs = "differs" // a strict majority holds another hash
	Unknown = "unknown" // no hash, fewer than two votes, or no strict majority
)

// Snapshot is the run at a glance: what the page shows and what GET
// /api/status returns. Times are RFC 3339 in UTC; bytes are bytes; losses are
// nats per token; absent (omitted) when no volunteer measured them.
type Snapshot struct {
	RunID      string    `json:"run_id"`
	Manifest   string    `json:"manifest"`    // first 12 characters of the manifest hash
	Preset     string    `json:"preset"`      // model preset
	Params     int       `json:"params"`      // model parameters
	Optimizer  string    `json:"optimizer"`   // outer optimizer kind
	InnerSteps int       `json:"inner_steps"` // H
	Bootstrap  []string  `json:"bootstrap,omitempty"`
	Started    time.Time `json:"started,omitzero"`
	Now        time.Time `json:"now"` // the server's clock when the snapshot was built

	// Round is the highest round that more than half of the current
	// reporters have reached (so one volunteer far ahead cannot move it).
	Round uint64 `json:"round"`
	// TrainLoss and ValLoss are those of the latest certified round up to
	// Round that has them (the curve's points); ValLossRound is that round
	// for ValLoss.
	TrainLoss    *float64 `json:"train_loss,omitempty"`
	ValLoss      *float64 `json:"val_loss,omitempty"`
	ValLossRound uint64   `json:"val_loss_round,omitempty"`
	// Data is the data progress of the latest certified round up to Round
	// that has one: a run over a packed dataset; absent otherwise.
	Data *DataProgress `json:"data,omitempty"`
	// TokensTrained is the sum over rounds of the tokens of the reporters
	// in each round's certified state.
	TokensTrained uint64  `json:"tokens_trained"`
	TokensPerSec  float64 `json:"tokens_per_sec"` // sum over the current reporters' latest reports
	BytesPerSec   float64 `json:"bytes_per_sec"`  // sent: sum of BytesSent / WallSeconds of the same reports
	BytesSent     uint64  `json:"bytes_sent"`     // total over all reports
	BytesRecv     uint64  `json:"bytes_recv"`     // total over all reports
	// FP32DPBytes is what fp32 data-parallel training (ring all-reduce after
	// every step) would have sent for the same work: the sum over non-adopted
	// reports of InnerSteps x 2(M-1)/M x 4 x Params bytes, M the report's
	// group size. TrafficSaved is FP32DPBytes / BytesSent ("N x less"), 0
	// when either is 0.
	FP32DPBytes   uint64  `json:"fp32_dp_bytes"`
	TrafficSaved  float64 `json:"traffic_saved"`  // 2 decimals
	Reports       uint64  `json:"reports"`        // reports accepted since the history began
	MembersOnline int     `json:"members_online"` // live members (current reporters when membership is unknown)
	MembersTotal  int     `json:"members_total"`  // rows before the cap of 256 on Members

	// BitsPerParam is what a volunteer sends for one round, per parameter:
	// the median over the contributors (not adopted) of the latest
	// certified round up to Round that has one of 8 x bytes sent / Params,
	// 4 decimals: everything the volunteer's host sent for the round (every
	// protocol, framing included). Absent while Params is 0 or no such round
	// has a contributor.
	BitsPerParam *float64 `json:"bits_per_param,omitempty"`

	Members []MemberRow `json:"members"` // online first, then by peer
	Curve   []Point     `json:"curve"`   // certified rounds; at most 1000 points (older rounds averaged in buckets)
	Events  []EventRow  `json:"events"`  // the latest 50, newest first

	// Pipeline is a staged run's stages, their replicas and the paths of
	// its latest iteration (WithPipeline); absent for a data-parallel run.
	Pipeline *Pipeline `json:"pipeline,omitempty"`
}

// DataProgress is how far a run over a packed dataset is through its data:
// the lower median, ordered by epoch then share, of what the data ledgers
// of the round's reporters in its certified state say.
type DataProgress struct {
	Epoch   uint64  `json:"epoch"`   // the epoch being trained, 0 first
	Trained float64 `json:"trained"` // share of the epoch's blocks trained, in [0, 1], 4 decimals
}

// Pipeline is a staged run as the page draws it: which members serve each
// stage, and the path every microbatch of the latest iteration took.
type Pipeline struct {
	SkipRatio float64     `json:"skip_ratio"`
	Iteration uint64      `json:"iteration"` // the latest iteration run
	Stages    []StageView `json:"stages"`    // by stage, 0 first
	Paths     []PathView  `json:"paths"`     // the latest iteration's, by microbatch
}

// StageView is one stage of a Pipeline.
type StageView struct {
	Stage    int      `json:"stage"`
	Holds    string   `json:"holds"`    // e.g. "embedding, head, layer 0"
	Replicas []string `json:"replicas"` // ShortIDs of the members serving it
	// Rebuilt says how the stage was last rebuilt after losing every
	// member ("checkfree from stages 1 and 3"), empty if never.
	Rebuilt string `json:"rebuilt,omitempty"`
}

// PathView is one microbatch's path: the stages it visits in order (it
// returns to stage 0 for the loss) and the member of each visit.
type PathView struct {
	Microbatch int      `json:"microbatch"`
	Stages     []int    `json:"stages"`
	Peers      []string `json:"peers"` // ShortIDs, one per visit
}

// Bounds of a Pipeline as served: a page draws it whole.
const (
	maxPipelineStages = 256
	maxStageReplicas  = 64
	maxPipelinePaths  = 256
	maxPipelineText   = 128
)

// bounded returns p cut to the bounds above (nil for nil), peer IDs
// shortened and text clipped, so that a caller's mistake cannot make the
// page unreadable.
func (p *Pipeline) bounded() *Pipeline {
	if p == nil {
		return nil
	}
	clip := func(s string) string { return cleanString(s, maxPipelineText) }
	short := func(ids []string, n int) []string {
		out := make([]string, 0, min(len(ids), n))
		for _, id := range ids[:min(len(ids), n)] {
			out = append(out, ShortID(id))
		}
		return out
	}
	out := &Pipeline{SkipRatio: p.SkipRatio, Iteration: p.Iteration}
	for _, st := range p.Stages[:min(len(p.Stages), maxPipelineStages)] {
		out.Stages = append(out.Stages, StageView{Stage: st.Stage, Holds: clip(st.Holds),
			Replicas: short(st.Replicas, maxStageReplicas), Rebuilt: clip(st.Rebuilt)})
	}
	for _, pv := range p.Paths[:min(len(p.Paths), maxPipelinePaths)] {
		n := min(len(pv.Stages), len(pv.Peers), maxPipelineStages)
		out.Paths = append(out.Paths, PathView{Microbatch: pv.Microbatch, Stages: slices.Clone(pv.Stages[:n]), Peers: short(pv.Peers, n)})
	}
	return out
}

// MemberRow is one line of the members table.
type MemberRow struct {
	Peer         string    `json:"peer"`   // ShortID of the peer ID
	Online       bool      `json:"online"` // live member (false: left recently, report still current)
	Role         string    `json:"role,omitempty"`
	Device       string    `json:"device,omitempty"`
	Version      string    `json:"version,omitempty"`
	TokensPerSec float64   `json:"tokens_per_sec"` // from its latest report while online and current, else 0
	LastSeen     time.Time `json:"last_seen,omitzero"`
	BytesSent    uint64    `json:"bytes_sent"` // total over its kept history
	BytesRecv    uint64    `json:"bytes_recv"`
	Round        uint64    `json:"round"`                // latest round known (gossip or report)
	StateHash    string    `json:"state_hash,omitempty"` // 16 hex digits
	Agreement    string    `json:"agreement"`            // Agree, Differs or Unknown
}

// Point is one point of the loss curve: the medians over the round's
// reporters whose state is the round's certified one (contributors only
// for Train).
type Point struct {
	Round     uint64    `json:"round"`
	T         time.Time `json:"t"` // last report of the round
	Train     *float64  `json:"train,omitempty"`
	Val       *float64  `json:"val,omitempty"`
	Reporters int       `json:"reporters"`
	// BitsPerParam is the round's Snapshot.BitsPerParam (the mean over a
	// bucket); absent when unknown.
	BitsPerParam *float64 `json:"bits_per_param,omitempty"`
}

// EventRow is one membership event on the timeline.
type EventRow struct {
	At     time.Time `json:"at"`
	Peer   string    `json:"peer"` // ShortID
	Kind   string    `json:"kind"` // join, leave or fail
	Role   string    `json:"role,omitempty"`
	Device string    `json:"device,omitempty"`
}

const (
	maxCurvePoints = 1000
	maxMemberRows  = 256
	eventsShown    = 50
	maxLiveMembers = 1 << 20
)

// Snapshot computes the run's summary at now. members lists the live
// members; nil means membership is unknown (then every peer with a current
// report counts as online). members is called once, before the store's lock
// is taken.
func (s *Store) Snapshot(info RunInfo, members func() []Member, now time.Time) (Snapshot, error) {
	var live map[string]Member
	if members != nil {
		ms := members()
		live = make(map[string]Member, min(len(ms), maxLiveMembers))
		for _, m := range ms {
			if len(live) >= maxLiveMembers || !ValidPeerID(m.Peer) {
				continue
			}
			m.Role = cleanString(m.Role, telemetry.MaxString)
			m.Device = cleanString(m.Device, telemetry.MaxString)
			live[m.Peer] = m
		}
	}

	snap := Snapshot{
		RunID:      cleanString(info.RunID, 128),
		Manifest:   cleanString(info.ManifestHash, 12),
		Preset:     cleanString(info.Preset, telemetry.MaxString),
		Params:     max(info.ParamCount, 0),
		Optimizer:  cleanString(info.Optimizer, telemetry.MaxString),
		InnerSteps: max(info.InnerSteps, 0),
		Now:        now.UTC().Truncate(time.Millisecond),
		Members:    []MemberRow{},
		Curve:      []Point{},
		Events:     []EventRow{},
	}
	if !info.Started.IsZero() {
		snap.Started = info.Started.UTC().Truncate(time.Millisecond)
	}
	for _, a := range info.BootstrapAddrs[:min(len(info.BootstrapAddrs), 8)] {
		if a = cleanString(a, 256); a != "" {
			snap.Bootstrap = append(snap.Bootstrap, a)
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Snapshot{}, ErrClosed
	}
	nowMS := now.UnixMilli()

	// Current reporters: a current latest report, and live when membership is known.
	var current, all []uint64
	for id, rec := range s.peers {
		all = append(all, rec.Latest.Round)
		if !s.fresh(rec, nowMS) {
			continue
		}
		if _, ok := live[id]; live != nil && !ok {
			continue
		}
		current = append(current, rec.Latest.Round)
		snap.TokensPerSec += rec.Latest.TokensPerSec
		if rec.Latest.WallSeconds > 0 {
			snap.BytesPerSec += float64(rec.Latest.BytesSent) / rec.Latest.WallSeconds
		}
	}
	snap.TokensPerSec, snap.BytesPerSec = finite(snap.TokensPerSec), finite(snap.BytesPerSec)
	switch {
	case len(current) > 0:
		snap.Round = majorityRound(current)
	case len(all) > 0:
		snap.Round = majorityRound(all)
	}
	snap.MembersOnline = len(current)
	if live != nil {
		snap.MembersOnline = len(live)
	}

	t := s.totals
	snap.TokensTrained, snap.BytesSent, snap.BytesRecv, snap.Reports = t.Tokens, t.BytesSent, t.BytesRecv, t.Reports
	dp := finite(t.DPUnits * 8 * float64(snap.InnerSteps) * float64(snap.Params))
	snap.FP32DPBytes = satUint(dp)
	if t.BytesSent > 0 && dp > 0 {
		snap.TrafficSaved = math.Round(finite(dp/float64(t.BytesSent))*100) / 100
	}

	// Losses, data progress and bits per parameter of the latest
	// (certified) round up to the current one that has them.
	end, found := s.findRound(snap.Round)
	if found {
		end++
	}
	wantBits := snap.Params > 0
	for i := end - 1; i >= 0 && (snap.TrainLoss == nil || snap.ValLoss == nil || snap.Data == nil || wantBits && snap.BitsPerParam == nil); i-- {
		p := &s.rounds[i]
		if wantBits && snap.BitsPerParam == nil && p.Certified {
			snap.BitsPerParam = p.bitsPerParam(snap.Params)
		}
		if snap.TrainLoss == nil {
			snap.TrainLoss = lossPtr(p.Train)
		}
		if snap.ValLoss == nil && !math.IsNaN(p.Val) {
			snap.ValLoss, snap.ValLossRound = lossPtr(p.Val), p.Round
		}
		if snap.Data == nil {
			snap.Data = p.data()
		}
	}
	snap.Curve = curve(s.rounds, snap.Params)

	rows, err := s.memberRows(live, nowMS)
	if err != nil {
		return Snapshot{}, err
	}
	snap.MembersTotal = len(rows)
	snap.Members = rows[:min(len(rows), maxMemberRows)]

	for i := len(s.events) - 1; i >= 0 && len(snap.Events) < eventsShown; i-- {
		e := s.events[i]
		snap.Events = append(snap.Events, EventRow{At: msTime(e.At), Peer: ShortID(e.Peer), Kind: e.Kind, Role: e.Role, Device: e.Device})
	}
	return snap, nil
}

// memberRows builds the members table: live members, then peers whose
// report is still current but that are no longer live; s.mu is held.
func (s *Store) memberRows(live map[string]Member, nowMS int64) ([]MemberRow, error) {
	type row struct {
		id   string
		m    *Member
		rec  *peerRecord
		hash uint64
		out  MemberRow
	}
	var rows []*row
	for id, m := range live {
		rows = append(rows, &row{id: id, m: &m, rec: s.peers[id]})
	}
	for id, rec := range s.peers {
		if _, ok := live[id]; !ok && s.fresh(rec, nowMS) {
			rows = append(rows, &row{id: id, rec: rec})
		}
	}

	var rounds []uint64
	for _, r := range rows {
		o := &r.out
		o.Peer = ShortID(r.id)
		o.Online = r.m != nil || live == nil
		if r.m != nil {
			o.Role, o.Device = r.m.Role, r.m.Device
			o.Round, r.hash = r.m.Round, r.m.StateHash
		}
		if rec := r.rec; rec != nil {
			if o.Role == "" {
				o.Role = rec.Role
			}
			if o.Device == "" {
				o.Device = rec.Latest.Device
			}
			o.Version = rec.Latest.Version
			if o.Online && s.fresh(rec, nowMS) {
				o.TokensPerSec = rec.Latest.TokensPerSec
			}
			o.LastSeen = msTime(rec.Last)
			o.BytesSent, o.BytesRecv = rec.BytesSent, rec.BytesRecv
			// The report's (round, hash) unless gossip has a hash at least as recent.
			if r.m == nil || r.m.StateHash == 0 || rec.Latest.Round > r.m.Round {
				o.Round, r.hash = rec.Latest.Round, rec.Latest.StateHash
			}
		}
		if r.hash != 0 {
			o.StateHash = hashHex(r.hash)
			rounds = append(rounds, o.Round)
		}
	}

	// Votes of each round: the reports' state hashes, plus the gossiped
	// hashes of live members that have not reported that round.
	records, err := s.roundRecords(rounds)
	if err != nil {
		return nil, err
	}
	votes := make(map[uint64]map[uint64]int)
	for _, round := range rounds {
		if votes[round] != nil {
			continue
		}
		v := make(map[uint64]int)
		if rr := records[round]; rr != nil {
			for _, h := range rr.Hashes {
				v[h.Hash] += h.Votes
			}
			v[0] += rr.OtherHashes // hash 0 never matches: "some other hash"
		}
		for id, m := range live {
			if m.Round == round && m.StateHash != 0 {
				if rec := s.peers[id]; rec == nil || rec.Latest.Round != round {
					v[m.StateHash]++
				}
			}
		}
		votes[round] = v
	}
	out := make([]MemberRow, 0, len(rows))
	for _, r := range rows {
		r.out.Agreement = Unknown
		if r.hash != 0 {
			r.out.Agreement = verdict(votes[r.out.Round], r.hash)
		}
		out = append(out, r.out)
	}
	slices.SortFunc(out, func(a, b MemberRow) int {
		if a.Online != b.Online {
			if a.Online {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Peer, b.Peer)
	})
	return out, nil
}

// verdict compares hash with the strict majority of votes.
func verdict(votes map[uint64]int, hash uint64) string {
	total := 0
	for _, n := range votes {
		total += n
	}
	if total < 2 {
		return Unknown
	}
	for h, n := range votes {
		if h != 0 && 2*n > total {
			if h == hash {
				return Agree
			}
			return Differs
		}
	}
	return Unknown
}

// curve turns the certified rounds into at most maxCurvePoints points: one
// per round, or bucket means of equal runs of rounds when there are more,
// each bucket named by its last round; bits per parameter for a model of
// params parameters.
func curve(rounds []point, params int) []Point {
	n := 0
	for _, p := range rounds {
		if p.Certified {
			n++
		}
	}
	out := make([]Point, 0, min(n, maxCurvePoints))
	per := (n + maxCurvePoints - 1) / maxCurvePoints
	var ts, vs, ss float64
	var tn, vn, sn, k int
	for _, p := range rounds {
		if !p.Certified {
			continue
		}
		if !math.IsNaN(p.Train) {
			ts, tn = ts+p.Train, tn+1
		}
		if !math.IsNaN(p.Val) {
			vs, vn = vs+p.Val, vn+1
		}
		if !math.IsNaN(float64(p.Sent)) {
			ss, sn = ss+float64(p.Sent), sn+1
		}
		if k++; k%per != 0 && k != n {
			continue
		}
		pt := Point{Round: p.Round, T: msTime(p.Last), Reporters: int(p.Reporters)}
		if tn > 0 {
			pt.Train = meanLoss(ts, tn)
		}
		if vn > 0 {
			pt.Val = meanLoss(vs, vn)
		}
		if sn > 0 {
			pt.BitsPerParam = bitsPerParam(ss/float64(sn), params)
		}
		out = append(out, pt)
		ts, vs, ss, tn, vn, sn = 0, 0, 0, 0, 0, 0
	}
	return out
}
