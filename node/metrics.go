package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/skein-ml/skein/p2p"
)

// metricsServer serves a volunteer's Prometheus metrics (--metrics ADDR).
type metricsServer struct {
	srv *http.Server
	ln  net.Listener
}

// serveMetrics registers the volunteer's metrics on a registry of its own
// and serves them on http://addr/metrics.
func serveMetrics(addr string, v *Volunteer) (*metricsServer, error) {
	reg := prometheus.NewRegistry()
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "skein", Subsystem: "node", Name: name, Help: help}, f))
	}
	counter := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "skein", Subsystem: "node", Name: name, Help: help}, f))
	}
	snap := func() roundMeasure {
		v.mu.Lock()
		defer v.mu.Unlock()
		return v.last
	}
	gauge("round", "The last outer round this volunteer completed or adopted.", func() float64 { return float64(snap().round) })
	gauge("train_loss", "Mean training loss of the last round's inner steps.", func() float64 { return float64(snap().trainLoss) })
	gauge("validation_loss", "Loss of the run's state on the fixed validation batches after the last round.", func() float64 { return float64(snap().valLoss) })
	gauge("tokens_per_second", "Training throughput during the last round's inner steps.", func() float64 { return snap().tokensPerSec })
	gauge("members", "Volunteers in the run, as this volunteer sees them.", func() float64 {
		n := 0
		for _, m := range v.pn.Members() {
			if m.Meta.Role == p2p.RoleVolunteer {
				n++
			}
		}
		return float64(n)
	})
	registerCaps(gauge, v.cfg)
	gauge("active", "1 while the volunteer trains, 0 while it is paused (a signal, or outside --active-hours).", func() float64 { return 1 })
	gauge("compute_fraction", "Fraction of the last round's wall time spent in inner steps.", func() float64 {
		m := snap()
		if m.wallSec <= 0 {
			return 0
		}
		return m.computeSec / m.wallSec
	})
	counter("tokens_total", "Tokens this volunteer trained on since it started.", func() float64 { return float64(snap().tokensTotal) })
	counter("rounds_total", "Rounds this volunteer contributed to since it started.", func() float64 { return float64(snap().contributed) })
	counter("rounds_adopted_total", "Rounds whose result this volunteer took from others instead of contributing.", func() float64 { return float64(snap().adopted) })
	counter("bytes_sent_total", "Bytes sent over libp2p since start.", func() float64 { return float64(v.pn.Traffic().Total.Out) })
	counter("bytes_received_total", "Bytes received over libp2p since start.", func() float64 { return float64(v.pn.Traffic().Total.In) })

	return listenMetrics(addr, reg, v.log)
}

// registerCaps registers the gauges of what the volunteer lends (--threads,
// --max-upload, --max-download, --max-memory), paused or not.
func registerCaps(gauge func(name, help string, f func() float64), cfg VolunteerConfig) {
	gauge("cap_upload_mbps", "The volunteer's upload cap on every stream, Mbit/s (0: none).", func() float64 { return cfg.MaxUploadMbps })
	gauge("cap_download_mbps", "The volunteer's download cap on every stream, Mbit/s (0: none).", func() float64 { return cfg.MaxDownloadMbps })
	gauge("cap_memory_mib", "The most memory the volunteer lets a run need, MiB (0: the system's available memory).", func() float64 { return float64(cfg.MaxMemoryMiB) })
	gauge("cap_threads", "CPU threads the volunteer lends (0: all cores).", func() float64 { return float64(cfg.Threads) })
}

// servePausedMetrics serves a paused volunteer's metrics: the caps,
// skein_node_active 0, and when the active hours resume training (0: on a
// signal).
func servePausedMetrics(cfg VolunteerConfig, resume time.Time) (*metricsServer, error) {
	reg := prometheus.NewRegistry()
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "skein", Subsystem: "node", Name: name, Help: help}, f))
	}
	registerCaps(gauge, cfg)
	gauge("active", "1 while the volunteer trains, 0 while it is paused (a signal, or outside --active-hours).", func() float64 { return 0 })
	gauge("resume_time_seconds", "When the active hours resume training, Unix seconds (0: on a resume signal).", func() float64 {
		if resume.IsZero() {
			return 0
		}
		return float64(resume.Unix())
	})
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return listenMetrics(cfg.MetricsAddr, reg, log)
}

// listenMetrics serves reg on http://addr/metrics.
func listenMetrics(addr string, reg *prometheus.Registry, log *slog.Logger) (*metricsServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("node: metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s := &metricsServer{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second}}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("metrics server stopped", "err", err)
		}
	}()
	log.Info("serving metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	return s, nil
}

func (s *metricsServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.srv.Shutdown(ctx)
}
