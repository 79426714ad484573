package telemetry

// Report is one volunteer's account of one outer round. Every field is the
// volunteer's own measurement; the bootstrap checks that the sender is a
// member of the run and bounds what it keeps, but cannot verify the numbers.
type Report struct {
	Round     uint64 // the outer round just completed (or adopted)
	StateHash uint64 // hash of the shared state after the round
	Adopted   bool   // the volunteer took the run's state instead of contributing

	TrainLoss float32 // mean training loss over the round's inner steps
	ValLoss   float32 // loss on the run's small fixed validation set; NaN when not measured

	Tokens       uint64  // tokens this volunteer trained on in the round
	TokensPerSec float64 // its training throughput during the round
	BytesSent    uint64  // bytes it sent over the network since the previous report
	BytesRecv    uint64  // bytes it received since the previous report
	// ComputeSeconds and WallSeconds: time spent in inner steps, and the
	// round's wall time (inner steps + communication + waiting).
	ComputeSeconds, WallSeconds float64

	Members int    // volunteers in the round's group
	Device  string // e.g. "cpu (8 threads)"; at most MaxString bytes
	Version string // the volunteer's skein version; at most MaxString bytes
	UnixMS  int64  // the volunteer's clock when it sent the report

	// HasData: the run trains on a packed dataset and Epoch and
	// EpochTrained are the volunteer's view of its data ledger after the
	// round (both 0 when false).
	HasData      bool
	Epoch        uint64  // the epoch being trained, 0 first
	EpochTrained float32 // the share of the epoch's blocks trained, in [0, 1]
}

// MaxString bounds Device and Version on the wire.
const MaxString = 64
