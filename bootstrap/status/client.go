package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// MaxSnapshotBytes bounds the body Fetch reads.
const MaxSnapshotBytes = 4 << 20

// ErrTooLarge: a status response is larger than MaxSnapshotBytes.
var ErrTooLarge = errors.New("status: response too large")

// Fetch reads the snapshot of the status server at baseURL ("host:port" or
// "http(s)://host:port[/prefix]"). The context bounds the request; without
// a deadline, 30 seconds apply.
func Fetch(ctx context.Context, baseURL string) (Snapshot, error) {
	var snap Snapshot
	err := getJSON(ctx, baseURL, &snap, nil, "api", "status")
	return snap, err
}

// FetchHistory returns the per-round aggregates of the run behind baseURL
// (GET /api/history), every page from round from on, at most maxRounds.
func FetchHistory(ctx context.Context, baseURL string, from uint64, maxRounds int) ([]RoundStats, error) {
	var out []RoundStats
	for len(out) < maxRounds {
		var page struct {
			Rounds []RoundStats `json:"rounds"`
			Next   *uint64      `json:"next_from_round"`
		}
		q := url.Values{"from_round": {fmt.Sprint(from)}, "limit": {fmt.Sprint(min(maxRounds-len(out), 5000))}}
		if err := getJSON(ctx, baseURL, &page, q, "api", "history"); err != nil {
			return out, err
		}
		out = append(out, page.Rounds...)
		if page.Next == nil || *page.Next <= from {
			break
		}
		from = *page.Next
	}
	return out, nil
}

// getJSON decodes the JSON document at baseURL/path... (at most
// MaxSnapshotBytes) into v.
func getJSON(ctx context.Context, baseURL string, v any, q url.Values, path ...string) error {
	if !strings.Contains(baseURL, "://") {
		baseURL = "http://" + baseURL
	}
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("status: address %q: want host:port or http(s)://host:port", baseURL)
	}
	u = u.JoinPath(path...)
	if q != nil {
		u.RawQuery = q.Encode()
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("status: get %s: %w", u.Redacted(), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxSnapshotBytes+1))
	if err != nil {
		return fmt.Errorf("status: read %s: %w", u.Redacted(), err)
	}
	if len(body) > MaxSnapshotBytes {
		return fmt.Errorf("%w: %s sent more than %d bytes", ErrTooLarge, u.Redacted(), MaxSnapshotBytes)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status: get %s: %s: %s", u.Redacted(), resp.Status, cleanString(string(body), 200))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("status: decode %s: %w", u.Redacted(), err)
	}
	return nil
}

// FormatText writes a compact human summary of s, for `skein status`. The
// snapshot came from a remote and maybe hostile server: its strings are
// cleaned of control characters (terminal escapes) first.
func FormatText(w io.Writer, s Snapshot) {
	s = s.forTerminal()
	fmt.Fprintf(w, "run %s", orDash(s.RunID))
	if s.Manifest != "" {
		fmt.Fprintf(w, " (manifest %s)", s.Manifest)
	}
	fmt.Fprintf(w, ": %s, %s params, %s", orDash(s.Preset), countText(float64(s.Params)), orDash(s.Optimizer))
	if s.InnerSteps > 0 {
		fmt.Fprintf(w, " H=%d", s.InnerSteps)
	}
	if !s.Started.IsZero() && !s.Now.IsZero() {
		fmt.Fprintf(w, ", started %s ago", durationText(s.Now.Sub(s.Started)))
	}
	fmt.Fprintln(w)

	val := "-"
	if s.ValLoss != nil {
		val = fmt.Sprintf("%.4f (round %d)", *s.ValLoss, s.ValLossRound)
	}
	fmt.Fprintf(w, "round %d   val loss %s   tokens %s   %s tok/s   %s/s sent   members online %d\n",
		s.Round, val, countText(float64(s.TokensTrained)), countText(s.TokensPerSec), bytesText(s.BytesPerSec), s.MembersOnline)
	if d := s.Data; d != nil {
		fmt.Fprintf(w, "epoch %d, %.1f%% trained\n", d.Epoch, 100*min(max(d.Trained, 0), 1))
	}
	fmt.Fprintf(w, "traffic %s sent, %s received", bytesText(float64(s.BytesSent)), bytesText(float64(s.BytesRecv)))
	if b := s.BitsPerParam; b != nil && *b >= 0 { // a remote's number: finite, maybe negative
		fmt.Fprintf(w, ", %s bits/param per round", bitsText(*b))
	}
	if s.TrafficSaved > 0 {
		fmt.Fprintf(w, "; fp32 data-parallel would have sent %s (%s x less)", bytesText(float64(s.FP32DPBytes)), ratioText(s.TrafficSaved))
	}
	fmt.Fprintln(w)

	if len(s.Members) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "PEER\tROLE\tDEVICE\tTOK/S\tSENT\tRECV\tROUND\tSTATE\tLAST SEEN")
		for _, m := range s.Members {
			peer := m.Peer
			if !m.Online {
				peer += " (left)"
			}
			state := m.Agreement
			if m.StateHash != "" {
				state = m.StateHash + " " + m.Agreement
			}
			seen := "-"
			if !m.LastSeen.IsZero() && !s.Now.IsZero() {
				seen = durationText(s.Now.Sub(m.LastSeen)) + " ago"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", peer, orDash(m.Role), orDash(m.Device),
				countText(m.TokensPerSec), bytesText(float64(m.BytesSent)), bytesText(float64(m.BytesRecv)), m.Round, state, seen)
		}
		tw.Flush()
		if s.MembersTotal > len(s.Members) {
			fmt.Fprintf(w, "... and %d more\n", s.MembersTotal-len(s.Members))
		}
	}
	if n := min(len(s.Events), 5); n > 0 {
		fmt.Fprintln(w, "\nrecent membership:")
		for _, e := range s.Events[:n] {
			fmt.Fprintf(w, "  %s  %-5s %s %s\n", e.At.UTC().Format("2006-01-02 15:04:05Z"), e.Kind, e.Peer,
				strings.TrimSpace(e.Role+" "+e.Device))
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// countText writes n with an SI suffix: 950, 12.3k, 4.56M.
func countText(n float64) string {
	switch {
	case n < 1e3:
		return fmt.Sprintf("%.0f", n)
	case n < 1e6:
		return fmt.Sprintf("%.3gk", n/1e3)
	case n < 1e9:
		return fmt.Sprintf("%.3gM", n/1e6)
	case n < 1e12:
		return fmt.Sprintf("%.3gG", n/1e9)
	}
	return fmt.Sprintf("%.3gT", n/1e12)
}

// bytesText writes a byte count with a decimal unit: 512 B, 1.2 MB.
func bytesText(n float64) string {
	units := []string{"B", "kB", "MB", "GB", "TB", "PB", "EB"}
	i := 0
	for n >= 1000 && i < len(units)-1 {
		n /= 1000
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", n)
	}
	return fmt.Sprintf("%.3g %s", n, units[i])
}

// bitsText writes bits per parameter with 2 decimals, 1 from 10 on, 2
// significant digits below 0.1: 0.42, 12.6, 0.0031.
func bitsText(b float64) string {
	switch {
	case b >= 10:
		return fmt.Sprintf("%.1f", b)
	case b >= 0.1 || b == 0:
		return fmt.Sprintf("%.2f", b)
	}
	return fmt.Sprintf("%.2g", b)
}

func ratioText(r float64) string {
	if r >= 100 {
		return fmt.Sprintf("%.0f", r)
	}
	return fmt.Sprintf("%.1f", r)
}

func durationText(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

// forTerminal returns s with every string cleaned by cleanString.
func (s Snapshot) forTerminal() Snapshot {
	c := func(v string) string { return cleanString(v, 128) }
	s.RunID, s.Manifest, s.Preset, s.Optimizer = c(s.RunID), c(s.Manifest), c(s.Preset), c(s.Optimizer)
	s.Members = slices.Clone(s.Members)
	for i := range s.Members {
		m := &s.Members[i]
		m.Peer, m.Role, m.Device, m.Version, m.StateHash, m.Agreement = c(m.Peer), c(m.Role), c(m.Device), c(m.Version), c(m.StateHash), c(m.Agreement)
	}
	s.Events = slices.Clone(s.Events)
	for i := range s.Events {
		e := &s.Events[i]
		e.Peer, e.Kind, e.Role, e.Device = c(e.Peer), c(e.Kind), c(e.Role), c(e.Device)
	}
	return s
}
