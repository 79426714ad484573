package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// A volunteer lends its machine when its owner says: `node join
// --active-hours 22:00-07:00` trains only in those hours (local time), and
// a signal pauses or resumes it (SIGUSR1, SIGUSR2). Pausing leaves the run
// gracefully, with the local checkpoint saved, so that the others do not
// wait for a member that does not train; resuming joins again from it.

// ActiveHours is a set of daily windows of local time; the zero value is
// always active.
type ActiveHours struct {
	windows []window
}

type window struct{ from, to time.Duration } // since midnight; to < from wraps past midnight

// ErrBadHours is returned (wrapped) for an --active-hours that does not
// parse.
var ErrBadHours = errors.New("node: active hours")

// ParseActiveHours reads "HH:MM-HH:MM[,HH:MM-HH:MM...]" (24-hour clock;
// a window whose end is before its start runs past midnight). "" is
// always active.
func ParseActiveHours(s string) (ActiveHours, error) {
	var a ActiveHours
	if strings.TrimSpace(s) == "" {
		return a, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > 24 {
		return a, fmt.Errorf("%w: %d windows, at most 24", ErrBadHours, len(parts))
	}
	for _, p := range parts {
		from, to, ok := strings.Cut(strings.TrimSpace(p), "-")
		if !ok {
			return ActiveHours{}, fmt.Errorf("%w: %q is not HH:MM-HH:MM", ErrBadHours, p)
		}
		f, err := clock(from)
		if err != nil {
			return ActiveHours{}, err
		}
		t, err := clock(to)
		if err != nil {
			return ActiveHours{}, err
		}
		if f == t {
			return ActiveHours{}, fmt.Errorf("%w: %q is empty (leave --active-hours out to train all day)", ErrBadHours, p)
		}
		a.windows = append(a.windows, window{f, t})
	}
	return a, nil
}

func clock(s string) (time.Duration, error) {
	var h, m int
	if n, err := fmt.Sscanf(strings.TrimSpace(s), "%d:%d", &h, &m); n != 2 || err != nil || h < 0 || h > 24 || m < 0 || m > 59 || (h == 24 && m != 0) {
		return 0, fmt.Errorf("%w: %q is not a time of day (HH:MM)", ErrBadHours, s)
	}
	return time.Duration(h)*time.Hour + time.Duration(m)*time.Minute, nil
}

// Always reports whether a is active at every moment.
func (a ActiveHours) Always() bool { return len(a.windows) == 0 }

// String is a as it was given, normalized.
func (a ActiveHours) String() string {
	if a.Always() {
		return "all day"
	}
	var parts []string
	for _, w := range a.windows {
		parts = append(parts, fmt.Sprintf("%s-%s", hhmm(w.from), hhmm(w.to)))
	}
	return strings.Join(parts, ",")
}

func hhmm(d time.Duration) string {
	return fmt.Sprintf("%02d:%02d", int(d.Hours()), int(d.Minutes())%60)
}

// Active reports whether t (in its own location) is inside a window.
func (a ActiveHours) Active(t time.Time) bool {
	if a.Always() {
		return true
	}
	// The wall clock's time of day (not the time elapsed since midnight,
	// which a daylight-saving change shifts by an hour).
	since := time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute +
		time.Duration(t.Second())*time.Second + time.Duration(t.Nanosecond())
	for _, w := range a.windows {
		if w.from < w.to && since >= w.from && since < w.to {
			return true
		}
		if w.from > w.to && (since >= w.from || since < w.to) {
			return true
		}
	}
	return false
}

// Next is the first moment after t at which Active changes (t plus a day
// at most; never for Always: the zero time).
func (a ActiveHours) Next(t time.Time) time.Time {
	if a.Always() {
		return time.Time{}
	}
	now := a.Active(t)
	// Boundaries are whole minutes: step to the next minute, then by minutes.
	next := t.Truncate(time.Minute).Add(time.Minute)
	for end := t.Add(25 * time.Hour); next.Before(end); next = next.Add(time.Minute) {
		if a.Active(next) != now {
			return next
		}
	}
	return time.Time{}
}

// JoinScheduled runs the volunteer while hours are active and it is not
// paused: toggle pauses and resumes it (a signal). At a window's end or a
// pause it leaves the run gracefully (the checkpoint saved); at the next
// window or on resume it joins again from that checkpoint.
//
// While it is paused, cfg.MetricsAddr (if set) still answers: the caps and
// skein_node_active 0, with when training resumes.
func JoinScheduled(ctx context.Context, cfg VolunteerConfig, hours ActiveHours, toggle <-chan struct{}) error {
	return joinScheduled(ctx, cfg, hours, toggle, Join)
}

func joinScheduled(ctx context.Context, cfg VolunteerConfig, hours ActiveHours, toggle <-chan struct{},
	join func(context.Context, VolunteerConfig) error) error {
	paused := false
	for ctx.Err() == nil {
		if paused || !hours.Active(time.Now()) {
			wait := "a resume signal"
			var at <-chan time.Time
			var resume time.Time
			if !paused {
				resume = hours.Next(time.Now())
				wait = "the active hours (" + hours.String() + "), at " + resume.Format("15:04")
				if !resume.IsZero() {
					at = time.After(time.Until(resume))
				}
			}
			say(cfg.Progress, "paused: training resumes with %s", wait)
			var ms *metricsServer
			if cfg.MetricsAddr != "" {
				var err error
				if ms, err = servePausedMetrics(cfg, resume); err != nil {
					say(cfg.Progress, "paused: no metrics while paused: %v", err)
				}
			}
			select {
			case <-ctx.Done():
			case <-toggle:
				paused = !paused
			case <-at:
			}
			if ms != nil {
				ms.close()
			}
			continue
		}
		jctx, leave := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- join(jctx, cfg) }()
		var end <-chan time.Time
		if next := hours.Next(time.Now()); !next.IsZero() {
			end = time.After(time.Until(next)) // none when the windows cover the whole day
		}
		var err error
		select {
		case err = <-done:
			leave()
			if err != nil || ctx.Err() != nil || cfg.Rounds > 0 {
				return err // failed, interrupted, or the rounds asked for are done
			}
		case <-toggle:
			paused = true
			say(cfg.Progress, "pause signal: leaving the run (the checkpoint is kept)")
			leave()
			err = <-done
		case <-end:
			say(cfg.Progress, "the active hours (%s) are over: leaving the run (the checkpoint is kept)", hours)
			leave()
			err = <-done
		}
		if err != nil {
			return err
		}
	}
	return nil
}
