package node

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseActiveHours(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string // normalized; "" for an error
	}{
		{"", "all day"},
		{"22:00-07:00", "22:00-07:00"},
		{"9:00-12:30, 14:00-18:00", "09:00-12:30,14:00-18:00"},
		{"00:00-24:00", "00:00-24:00"},
		{"22:00", ""},
		{"25:00-07:00", ""},
		{"10:60-11:00", ""},
		{"10:00-10:00", ""},
		{"ten-eleven", ""},
		{"24:30-01:00", ""},
	} {
		a, err := ParseActiveHours(c.in)
		switch {
		case c.want == "" && !errors.Is(err, ErrBadHours):
			t.Errorf("%q: %v, want ErrBadHours", c.in, err)
		case c.want != "" && (err != nil || a.String() != c.want):
			t.Errorf("%q: %q, %v; want %q", c.in, a.String(), err, c.want)
		}
	}
}

func TestActiveHours(t *testing.T) {
	at := func(h, m int) time.Time { return time.Date(2026, 11, 24, h, m, 0, 0, time.UTC) }
	night, _ := ParseActiveHours("22:00-07:00")
	day, _ := ParseActiveHours("09:00-12:30,14:00-18:00")
	for _, c := range []struct {
		a      ActiveHours
		t      time.Time
		active bool
		next   time.Time
	}{
		{night, at(23, 15), true, at(7, 0).AddDate(0, 0, 1)},
		{night, at(3, 0), true, at(7, 0)},
		{night, at(7, 0), false, at(22, 0)},
		{night, at(12, 0), false, at(22, 0)},
		{day, at(8, 59), false, at(9, 0)},
		{day, at(12, 30), false, at(14, 0)},
		{day, at(15, 10), true, at(18, 0)},
		{day, at(19, 0), false, at(9, 0).AddDate(0, 0, 1)},
	} {
		if got := c.a.Active(c.t); got != c.active {
			t.Errorf("%s at %s: active %v", c.a, c.t.Format("15:04"), got)
		}
		if got := c.a.Next(c.t); !got.Equal(c.next) {
			t.Errorf("%s at %s: next change %s, want %s", c.a, c.t.Format("15:04"), got, c.next)
		}
	}
	var always ActiveHours
	if !always.Active(at(3, 0)) || !always.Next(at(3, 0)).IsZero() {
		t.Error("the zero ActiveHours is always active and never changes")
	}
}

// A pause signal leaves the run and a resume joins it again; while paused,
// --metrics still answers with the caps and skein_node_active 0.
func TestJoinScheduledPauseResume(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := DefaultVolunteerConfig("pause-test")
	cfg.MetricsAddr, cfg.Threads, cfg.MaxUploadMbps, cfg.Progress = addr, 3, 16, io.Discard
	joins := make(chan struct{}, 4)
	join := func(ctx context.Context, _ VolunteerConfig) error {
		joins <- struct{}{}
		<-ctx.Done()
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	toggle := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- joinScheduled(ctx, cfg, ActiveHours{}, toggle, join) }()
	wait := func(what string) {
		t.Helper()
		select {
		case <-joins:
		case <-time.After(10 * time.Second):
			t.Fatalf("no join %s", what)
		}
	}
	wait("at the start")
	toggle <- struct{}{} // pause
	var body string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no /metrics while paused")
		}
	}
	for _, want := range []string{"skein_node_active 0", "skein_node_cap_threads 3", "skein_node_cap_upload_mbps 16", "skein_node_resume_time_seconds 0"} {
		if !strings.Contains(body, want) {
			t.Errorf("paused /metrics lacks %q:\n%s", want, body)
		}
	}
	toggle <- struct{}{} // resume
	wait("after the resume signal")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Windows that cover the whole day never end: the volunteer joins once
// and stays (it used to leave and rejoin at once, forever).
func TestJoinScheduledWholeDay(t *testing.T) {
	hours, err := ParseActiveHours("00:00-24:00")
	if err != nil {
		t.Skipf("00:00-24:00 is refused: %v", err)
	}
	cfg := DefaultVolunteerConfig("whole-day")
	cfg.Progress = io.Discard
	var joins atomic.Int32
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = joinScheduled(ctx, cfg, hours, nil, func(ctx context.Context, _ VolunteerConfig) error {
		joins.Add(1)
		<-ctx.Done()
		return nil
	})
	if err != nil || joins.Load() != 1 {
		t.Fatalf("joined %d times (%v), want once", joins.Load(), err)
	}
}
