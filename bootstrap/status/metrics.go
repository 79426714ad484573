package status

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics of the run (GET /metrics), all read from one snapshot per scrape.
var (
	descInfo = prometheus.NewDesc("skein_run_info", "The run this bootstrap serves (value 1).",
		[]string{"run_id", "manifest", "preset", "optimizer"}, nil)
	descRound         = prometheus.NewDesc("skein_run_round", "Outer round reached by a majority of the current reporters.", nil, nil)
	descMembers       = prometheus.NewDesc("skein_run_members_online", "Live members of the run.", nil, nil)
	descValLoss       = prometheus.NewDesc("skein_run_validation_loss", "Mean validation loss of the latest round that measured it (nats per token).", nil, nil)
	descTrainLoss     = prometheus.NewDesc("skein_run_train_loss", "Mean training loss of the latest round (nats per token).", nil, nil)
	descTokens        = prometheus.NewDesc("skein_run_tokens_total", "Tokens trained, summed over all reports.", nil, nil)
	descTokensPerSec  = prometheus.NewDesc("skein_run_tokens_per_second", "Training throughput of the current reporters.", nil, nil)
	descBytesSent     = prometheus.NewDesc("skein_run_bytes_sent_total", "Bytes sent by volunteers, summed over all reports.", nil, nil)
	descBytesRecv     = prometheus.NewDesc("skein_run_bytes_received_total", "Bytes received by volunteers, summed over all reports.", nil, nil)
	descBytesPerSec   = prometheus.NewDesc("skein_run_bytes_sent_per_second", "Bytes per second sent by the current reporters.", nil, nil)
	descDPBytes       = prometheus.NewDesc("skein_run_fp32_dp_bytes_total", "Bytes fp32 data-parallel training would have sent for the same work.", nil, nil)
	descSaved         = prometheus.NewDesc("skein_run_traffic_saved_ratio", "fp32 data-parallel bytes divided by bytes actually sent.", nil, nil)
	descBits          = prometheus.NewDesc("skein_run_bits_per_param", "Bits a volunteer sent per model parameter in the latest certified round (median over its contributors).", nil, nil)
	descReports       = prometheus.NewDesc("skein_run_reports_total", "Telemetry reports accepted.", nil, nil)
	descRefused       = prometheus.NewDesc("skein_run_reports_refused_total", "Telemetry reports refused (by the bootstrap or the history store) since start.", nil, nil)
	descStreams       = prometheus.NewDesc("skein_run_status_streams", "Open SSE streams of the status page.", nil, nil)
	descSnapshotError = prometheus.NewDesc("skein_run_status_up", "1 if the history could be read at this scrape.", nil, nil)
)

// collector exports a Server's snapshot; it is registered on the server's
// own registry, never the global one.
type collector struct{ s *Server }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInfo, descRound, descMembers, descValLoss, descTrainLoss, descTokens,
		descTokensPerSec, descBytesSent, descBytesRecv, descBytesPerSec, descDPBytes, descSaved, descBits, descReports,
		descRefused, descStreams, descSnapshotError} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	counter(descRefused, float64(c.s.refused.Load()+c.s.store.Refused()))
	gauge(descStreams, float64(c.s.streams.Load()))
	b, err := c.s.current(statusMaxAge)
	if err != nil {
		gauge(descSnapshotError, 0)
		return
	}
	gauge(descSnapshotError, 1)
	s := b.snap
	gauge(descInfo, 1, s.RunID, s.Manifest, s.Preset, s.Optimizer)
	gauge(descRound, float64(s.Round))
	gauge(descMembers, float64(s.MembersOnline))
	if s.ValLoss != nil {
		gauge(descValLoss, *s.ValLoss)
	}
	if s.TrainLoss != nil {
		gauge(descTrainLoss, *s.TrainLoss)
	}
	counter(descTokens, float64(s.TokensTrained))
	gauge(descTokensPerSec, s.TokensPerSec)
	counter(descBytesSent, float64(s.BytesSent))
	counter(descBytesRecv, float64(s.BytesRecv))
	gauge(descBytesPerSec, s.BytesPerSec)
	counter(descDPBytes, float64(s.FP32DPBytes))
	gauge(descSaved, s.TrafficSaved)
	if s.BitsPerParam != nil {
		gauge(descBits, *s.BitsPerParam)
	}
	counter(descReports, float64(s.Reports))
}
