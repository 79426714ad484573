package trainer

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Progress renders a one-line progress bar (step, loss, tokens/s, ETA) on a
// terminal, or a plain line every few seconds when the writer is not one.
// The rate and ETA are measured from the first step seen, so the first
// step's one-time costs (allocation, page faults, corpus index) do not
// inflate the estimate.
type Progress struct {
	w              io.Writer
	tty            bool
	start, total   int
	tokensPerStep  int
	began, lastOut time.Time
	// anchor is the first Update: rates are measured from there.
	anchorAt   time.Time
	anchorStep int
	lastLen    int
}

// NewProgress starts a bar for steps (start, total]; nil w disables it.
func NewProgress(w io.Writer, start, total, tokensPerStep int) *Progress {
	p := &Progress{w: w, start: start, total: total, tokensPerStep: tokensPerStep, began: time.Now()}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// Update shows that step steps are done with this loss.
func (p *Progress) Update(step int, loss float32) {
	if p.w == nil {
		return
	}
	now := time.Now()
	if p.anchorAt.IsZero() {
		p.anchorAt, p.anchorStep = now, step
	}
	interval := 2 * time.Second
	if p.tty {
		interval = 100 * time.Millisecond
	}
	if now.Sub(p.lastOut) < interval && step != p.total {
		return
	}
	p.lastOut = now
	done := step - p.anchorStep
	elapsed := now.Sub(p.anchorAt).Seconds()
	tps, eta := 0.0, "?"
	if done > 0 && elapsed > 0 {
		tps = float64(done*p.tokensPerStep) / elapsed
		eta = time.Duration(float64(p.total-step) * elapsed / float64(done) * float64(time.Second)).Round(time.Second).String()
	}
	width := 24
	filled := width * step / max(p.total, 1)
	bar := strings.Repeat("=", filled) + strings.Repeat(" ", width-filled)
	line := fmt.Sprintf("step %d/%d [%s] loss %.4f | %s tok/s | ETA %s", step, p.total, bar, loss, HumanRate(tps), eta)
	if p.tty {
		pad := ""
		if n := p.lastLen - len(line); n > 0 {
			pad = strings.Repeat(" ", n)
		}
		fmt.Fprintf(p.w, "\r%s%s", line, pad)
		p.lastLen = len(line)
	} else {
		fmt.Fprintln(p.w, line)
	}
}

// Note prints a message on its own line without breaking the bar.
func (p *Progress) Note(msg string) {
	if p.w == nil {
		return
	}
	if p.tty && p.lastLen > 0 {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.lastLen))
		p.lastLen = 0
	}
	fmt.Fprintln(p.w, msg)
}

// Done ends the bar's line.
func (p *Progress) Done() {
	if p.w != nil && p.tty && p.lastLen > 0 {
		fmt.Fprintln(p.w)
	}
}

// HumanRate formats a rate as 950, 12.3k or 1.25M.
func HumanRate(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}
