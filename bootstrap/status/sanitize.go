package status

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/skein-ml/skein/telemetry"
)

// Limits applied to the numbers of a report. Each is far above what an honest
// volunteer reports in one round, and low enough that sums over the largest
// history cannot overflow before they saturate.
const (
	maxLoss         = 1e6     // a loss above this (or negative, or not finite) counts as not measured
	maxTokens       = 1 << 40 // tokens per report
	maxBytes        = 1 << 44 // bytes sent or received per report (16 TiB)
	maxRate         = 1e12    // tokens per second
	maxSeconds      = 1e7     // compute or wall seconds of one round (about 4 months)
	maxMembers      = 1 << 20 // group size
	maxPeerIDLength = 128
)

// ValidPeerID reports whether id is acceptable as a peer ID: 1 to 128 bytes of
// printable ASCII without spaces (libp2p peer IDs are base58 or base32).
func ValidPeerID(id string) bool {
	if id == "" || len(id) > maxPeerIDLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return false
		}
	}
	return true
}

// ShortID is the short form of a peer ID shown on the page and in the API:
// the 8 characters after the common "12D3KooW" (Ed25519) or "Qm" prefix, or
// the first 8 characters of any other ID.
func ShortID(id string) string {
	switch {
	case strings.HasPrefix(id, "12D3KooW") && len(id) > 8:
		id = id[8:]
	case strings.HasPrefix(id, "Qm") && len(id) > 2:
		id = id[2:]
	}
	if len(id) > 8 {
		id = id[:8]
	}
	return id
}

// cleanString keeps the printable part of s: invalid UTF-8, control and
// format characters (bidirectional overrides included) are dropped, runs of
// spaces collapse, and the result is cut to at most max bytes on a rune
// boundary.
func cleanString(s string, max int) string {
	var b strings.Builder
	space := false
	for _, r := range s {
		switch {
		case unicode.IsSpace(r):
			space = b.Len() > 0
			continue
		case r == utf8.RuneError, unicode.IsControl(r), unicode.Is(unicode.Cf, r):
			continue
		}
		n := utf8.RuneLen(r)
		if space {
			n++
		}
		if b.Len()+n > max {
			break
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		b.WriteRune(r)
	}
	return b.String()
}

// loss returns x as a loss and whether it is a measurement.
func loss(x float32) (float64, bool) {
	f := float64(x)
	if math.IsNaN(f) || f < 0 || f > maxLoss {
		return 0, false
	}
	return f, true
}

// clampFloat returns x limited to [0, hi]; NaN becomes 0.
func clampFloat(x, hi float64) float64 {
	switch {
	case math.IsNaN(x) || x <= 0:
		return 0
	case x > hi:
		return hi
	}
	return x
}

// finite replaces a non-finite value by 0 (for values derived by arithmetic
// just before they are encoded).
func finite(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	return x
}

// meanLoss is sum/n rounded to 5 decimals (the reports are float32; more
// digits would be noise).
func meanLoss(sum float64, n int) *float64 {
	v := math.Round(finite(sum/float64(n))*1e5) / 1e5
	return &v
}

// satUint converts a non-negative x to uint64, saturating.
func satUint(x float64) uint64 {
	if x = finite(x); x >= math.MaxUint64 {
		return math.MaxUint64
	}
	return uint64(max(x, 0))
}

// lossPtr is x rounded to 5 decimals, nil for NaN.
func lossPtr(x float64) *float64 {
	if math.IsNaN(x) {
		return nil
	}
	return meanLoss(x, 1)
}

// median of xs (reordered), NaN for none: one liar among three or more
// values cannot move it out of the range of the others.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	m := len(xs) / 2
	if len(xs)%2 == 1 {
		return xs[m]
	}
	return (xs[m-1] + xs[m]) / 2
}

// bitsPerParam is 8 x bytes / params rounded to 4 decimals: the bits sent
// per parameter of a model of params parameters. It is nil when bytes is
// NaN (none reported) or params is not positive.
func bitsPerParam(bytes float64, params int) *float64 {
	if math.IsNaN(bytes) || params <= 0 {
		return nil
	}
	v := math.Round(finite(8*max(bytes, 0)/float64(params))*1e4) / 1e4
	return &v
}

// medianProgress returns the lower median of the samples' data progress,
// ordered by epoch then share trained (xs is reordered; at least one): one
// liar among three or more cannot move it out of the range of the others.
func medianProgress(xs []sample) sample {
	slices.SortFunc(xs, func(a, b sample) int {
		return cmp.Or(cmp.Compare(a.Epoch, b.Epoch), cmp.Compare(a.Trained, b.Trained))
	})
	return xs[(len(xs)-1)/2]
}

// addSat adds without wrapping around.
func addSat(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}

// subFloor subtracts without going below zero.
func subFloor(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// sanitize turns a volunteer's report, received at the bootstrap's time
// atMS, into what the store keeps.
func sanitize(rep telemetry.Report, atMS int64) report {
	r := report{
		At:             atMS,
		Round:          rep.Round,
		StateHash:      rep.StateHash,
		Adopted:        rep.Adopted,
		Tokens:         min(rep.Tokens, maxTokens),
		TokensPerSec:   clampFloat(rep.TokensPerSec, maxRate),
		BytesSent:      min(rep.BytesSent, maxBytes),
		BytesRecv:      min(rep.BytesRecv, maxBytes),
		ComputeSeconds: clampFloat(rep.ComputeSeconds, maxSeconds),
		WallSeconds:    clampFloat(rep.WallSeconds, maxSeconds),
		Members:        min(max(rep.Members, 0), maxMembers),
		Device:         cleanString(rep.Device, telemetry.MaxString),
		Version:        cleanString(rep.Version, telemetry.MaxString),
		SentMS:         rep.UnixMS,
	}
	if !rep.Adopted {
		r.Train, r.HasTrain = loss(rep.TrainLoss)
	}
	r.Val, r.HasVal = loss(rep.ValLoss)
	if rep.HasData {
		r.HasData, r.Epoch = true, rep.Epoch
		r.EpochTrained = clampFloat(float64(rep.EpochTrained), 1)
	}
	return r
}
