package status

import (
	"net/http"
	"time"
)

// serveEvents is GET /api/events: a server-sent-events stream of snapshots.
// It sends the snapshot on connect and again after every change (store
// writes, Notify, or a periodic rebuild that finds different content), at
// most once per minPush, a comment line every heartbeat, and ends when the
// client goes away or the server closes. Nothing is locked while it writes:
// each stream has its own goroutine (the request's) and reads the shared,
// already encoded snapshot.
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	if r.Method == http.MethodHead {
		h.Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		return
	}
	if n := s.streams.Add(1); n > int64(s.opt.maxStreams) {
		s.streams.Add(-1)
		h.Set("Retry-After", "10")
		writeError(w, http.StatusServiceUnavailable, "too many live clients; retry later or poll /api/status")
		return
	}
	defer s.streams.Add(-1)
	select {
	case <-s.done:
		writeError(w, http.StatusServiceUnavailable, "shutting down")
		return
	default:
	}

	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	st := stream{w: w, rc: http.NewResponseController(w)}
	if st.write([]byte("retry: 3000\n\n")) != nil {
		return
	}

	ctx := r.Context()
	heartbeat := time.NewTicker(s.opt.heartbeat)
	defer heartbeat.Stop()
	refresh := time.NewTicker(s.opt.refresh)
	defer refresh.Stop()
	var (
		sent     uint64 // content hash of the last snapshot sent
		sentOnce bool
		last     time.Time
	)
	for {
		// Take the change channels before building, so no change is missed.
		changed := s.store.Changed()
		_, notified := s.notified()
		b, err := s.current(s.opt.refresh)
		if err != nil {
			s.opt.log.Debug("status: stream ends", "err", err)
			return
		}
		if !sentOnce || b.content != sent {
			msg := make([]byte, 0, len(b.body)+32)
			msg = append(msg, "event: snapshot\ndata: "...)
			msg = append(msg, b.body...)
			msg = append(msg, "\n\n"...)
			if st.write(msg) != nil {
				return
			}
			sent, sentOnce, last = b.content, true, time.Now()
			heartbeat.Reset(s.opt.heartbeat)
		}

		var wake bool
		select {
		case <-ctx.Done():
			return
		case <-s.done:
			return
		case <-heartbeat.C:
			if st.write([]byte(": heartbeat\n\n")) != nil {
				return
			}
		case <-refresh.C:
		case <-changed:
			wake = true
		case <-notified:
			wake = true
		}
		if wait := s.opt.minPush - time.Since(last); wake && wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-s.done:
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// stream writes to one SSE client with a deadline on every write, so a
// client that stops reading is dropped instead of holding its goroutine.
type stream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (st stream) write(p []byte) error {
	_ = st.rc.SetWriteDeadline(time.Now().Add(streamWriteLimit)) // not supported by every ResponseWriter
	if _, err := st.w.Write(p); err != nil {
		return err
	}
	return st.rc.Flush()
}
