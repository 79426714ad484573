package node

import (
	"context"
	"log/slog"
	"time"

	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/telemetry"
)

// reporter sends reports in the background, one at a time; a report that
// arrives while the previous is still being sent replaces any waiting one.
type reporter struct {
	n     *p2p.Node
	log   *slog.Logger
	queue chan telemetry.Report
	done  chan struct{}
}

func newReporter(n *p2p.Node, log *slog.Logger) *reporter {
	r := &reporter{n: n, log: log, queue: make(chan telemetry.Report, 1), done: make(chan struct{})}
	go r.run()
	return r
}

// send queues rep, dropping an older report still waiting.
func (r *reporter) send(rep telemetry.Report) {
	for {
		select {
		case r.queue <- rep:
			return
		default:
		}
		select {
		case <-r.queue:
		default:
		}
	}
}

// close stops the sender after the queued report, waiting at most a few
// seconds.
func (r *reporter) close() {
	close(r.queue)
	select {
	case <-r.done:
	case <-time.After(2 * time.Second):
	}
}

func (r *reporter) run() {
	defer close(r.done)
	for rep := range r.queue {
		b, err := rep.MarshalBinary()
		if err != nil {
			r.log.Debug("telemetry report not encodable", "err", err)
			continue
		}
		for _, m := range r.n.Members() {
			if m.Meta.Role != p2p.RoleBootstrap || !r.n.IsSeed(m.ID) {
				continue // only to the bootstraps this member dialled, not to whoever claims the role
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s, err := r.n.Open(ctx, m.ID, p2p.ProtoTelemetry, p2p.MessageFrameConfig(telemetry.MaxReportSize))
			if err == nil {
				if err = s.WriteFrame(telemetry.FrameType, b); err == nil {
					err = s.CloseWrite()
				}
				if err != nil {
					s.Reset()
				} else {
					s.Close()
				}
			}
			cancel()
			if err != nil {
				r.log.Debug("telemetry", "bootstrap", m.ID, "err", err)
			}
		}
	}
}
