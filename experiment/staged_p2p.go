package experiment

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/wan"
	"github.com/skein-ml/skein/pipeline"
	"github.com/skein-ml/skein/transport"
)

// StagedNetwork moves a staged run's traffic over real libp2p instead of
// the in-memory network: every stage replica is a p2p.Node on loopback
// (QUIC), joined through a seed as volunteers join a run, and every UDP
// packet it sends goes through the WAN emulator. The relay's activations
// and gradients travel on p2p.ProtoActivations, each stage's DiLoCo on its
// own p2p.ProtoStageReduce, and a stage lost to a failure is replaced by
// new nodes (new identities) that take their neighbours' weights over the
// bulk protocol before CheckFree rebuilds the stage from them.
type StagedNetwork struct {
	// Link is every node's uplink: one-way latency, and a rate in bits/s
	// that everything the node sends shares, as on a home connection. The
	// zero Link is plain loopback.
	Link wan.Link
}

// stagedSwarm is the p2p side of a staged run: the seed and one node per
// stage replica (node v = stage v/R, replica v%R), and each node's
// transports.
type stagedSwarm struct {
	cfg   StagedNetwork
	runID string
	emu   *wan.Emulator
	seed  *p2p.Seed
	log   *slog.Logger
	relay int64 // the relay's largest message
	outer int64 // the collective's largest message

	mu    sync.Mutex
	nodes []*p2p.Node
	// weights is what each node serves to a replacement of a neighbouring
	// stage: its last gradient norm and its trainable parameters
	// (encodeStageWeights), published after every DiLoCo round.
	weights [][]byte
	// relayBytes counts the activation protocol's bytes sent by nodes
	// closed so far (the live nodes' counters are added on reading).
	relayBytes int64
}

// stagedRunID names the staged run's swarm (protocol IDs carry it).
const stagedRunID = "staged"

// stageWeightsKey is the bulk key under which a node serves its weights.
const stageWeightsKey = "stage-weights"

func newStagedSwarm(ctx context.Context, cfg StagedNetwork, nodes int, relayMax, outerMax int64, log *slog.Logger) (_ *stagedSwarm, err error) {
	if err := cfg.Link.Validate(); err != nil {
		return nil, fmt.Errorf("%w: staged network: %w", ErrConfig, err)
	}
	if relayMax > math.MaxUint32 || outerMax > math.MaxUint32 {
		return nil, fmt.Errorf("%w: staged network: messages of %d and %d bytes exceed a frame", ErrConfig, relayMax, outerMax)
	}
	sw := &stagedSwarm{cfg: cfg, runID: stagedRunID, log: log, relay: relayMax, outer: outerMax,
		nodes: make([]*p2p.Node, nodes), weights: make([][]byte, nodes)}
	defer func() {
		if err != nil {
			sw.close()
		}
	}()
	if sw.emu, err = wan.New(cfg.Link, 1); err != nil {
		return nil, err
	}
	// One shaper per sending socket: a node's uplink, whoever it sends to.
	sw.emu.SetKeyFunc(func(local, _ net.Addr) [2]string { return [2]string{local.String(), "uplink"} })
	sc := p2p.DefaultSeedConfig(sw.runID, "")
	sc.ListenAddrs, sc.ListenUDP, sc.Timing = quicLoopback, sw.emu.ListenUDP, p2p.LANTiming()
	sc.Logger = log.With("node", "seed")
	if sw.seed, err = p2p.NewSeed(ctx, sc); err != nil {
		return nil, fmt.Errorf("experiment: staged network: seed: %w", err)
	}
	errs := make([]error, nodes)
	var wg sync.WaitGroup
	for v := range nodes {
		wg.Go(func() { errs[v] = sw.start(ctx, v) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return sw, sw.waitMembers(ctx)
}

// quicLoopback is where the staged run's nodes listen: QUIC on loopback,
// any port, so that every packet goes through the emulator's UDP socket.
var quicLoopback = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}

// start brings up node v (a new identity each time) and its bulk service.
func (sw *stagedSwarm) start(ctx context.Context, v int) error {
	c := p2p.DefaultNodeConfig(sw.runID)
	c.ListenAddrs, c.ListenUDP, c.Timing = quicLoopback, sw.emu.ListenUDP, p2p.LANTiming()
	c.Bootstrap = []string{sw.seed.FullAddr().String()}
	c.JoinTimeout, c.RejoinInterval = 10*time.Second, time.Second
	c.Logger = sw.log.With("node", v)
	pn, err := p2p.NewNode(ctx, c)
	if err != nil {
		return fmt.Errorf("experiment: staged network: node %d: %w", v, err)
	}
	err = pn.ServeBulk(func(_ context.Context, _ peer.ID, key string) (io.ReaderAt, int64, error) {
		if key != stageWeightsKey {
			return nil, 0, fmt.Errorf("no bulk key %q", key)
		}
		sw.mu.Lock()
		b := sw.weights[v]
		sw.mu.Unlock()
		if b == nil {
			return nil, 0, errors.New("no weights published yet")
		}
		return bytes.NewReader(b), int64(len(b)), nil
	}, 0)
	if err != nil {
		pn.Close()
		return fmt.Errorf("experiment: staged network: node %d: %w", v, err)
	}
	sw.mu.Lock()
	sw.nodes[v] = pn
	sw.mu.Unlock()
	return nil
}

// waitMembers waits until every node sees all the others (and the seed).
func (sw *stagedSwarm) waitMembers(ctx context.Context) error {
	want := len(sw.nodes) + 1
	deadline := time.Now().Add(60 * time.Second)
	for {
		short := -1
		for v, pn := range sw.live() {
			if pn.NumMembers() != want {
				short = v
				break
			}
		}
		if short < 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("experiment: staged network: node %d sees %d of %d members after a minute", short, sw.live()[short].NumMembers(), want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (sw *stagedSwarm) live() []*p2p.Node {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return slices.Clone(sw.nodes)
}

// id is node v's peer ID, as the relay and the collectives name it.
func (sw *stagedSwarm) id(v int) transport.PeerID {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return transport.PeerID(sw.nodes[v].ID().String())
}

// relayPeers is node v's endpoint of the SkipPipe relay, and what closes
// it.
func (sw *stagedSwarm) relayPeers(v int) (transport.Peers, func(), error) {
	p, err := p2p.NewPeers(sw.live()[v], p2p.ProtoActivations, uint32(sw.relay), 2*time.Minute)
	if err != nil {
		return nil, nil, err
	}
	return p, p.Close, nil
}

// outerPeers is node v's endpoint of stage s's collective, whose members are
// the stage's replicas only.
func (sw *stagedSwarm) outerPeers(v, s int, members []transport.PeerID) (transport.Peers, func(), error) {
	p, err := p2p.NewPeers(sw.live()[v], p2p.ProtoStageReduce(s), uint32(sw.outer), 2*time.Minute)
	if err != nil {
		return nil, nil, err
	}
	return stagePeers{Peers: p, members: members}, p.Close, nil
}

// signer is node v's signature for the collective's messages.
func (sw *stagedSwarm) signer(v int) transport.Signer { return sw.live()[v].Signer() }

// publish makes norm and params what node v serves to a replacement.
func (sw *stagedSwarm) publish(v int, norm float64, params []float32) {
	b := pipeline.EncodeStageWeights(norm, params)
	sw.mu.Lock()
	sw.weights[v] = b
	sw.mu.Unlock()
}

// fetchWeights takes node v's published weights over the bulk protocol,
// from node self: n parameters and the gradient norm.
func (sw *stagedSwarm) fetchWeights(ctx context.Context, self, v, n int) (float64, []float32, error) {
	nodes := sw.live()
	buf := make(memBuffer, pipeline.StageWeightsSize(n))
	fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := nodes[self].Fetch(fctx, nodes[v].ID(), stageWeightsKey, buf, p2p.FetchOptions{Length: int64(len(buf))}); err != nil {
		return 0, nil, fmt.Errorf("experiment: weights of node %d: %w", v, err)
	}
	return pipeline.DecodeStageWeights(buf, n)
}

// kill closes node v (its peers see it leave); start brings up its
// replacement, a new identity.
func (sw *stagedSwarm) kill(v int) {
	sw.mu.Lock()
	old := sw.nodes[v]
	sw.weights[v] = nil
	sw.mu.Unlock()
	sw.relayBytes += old.Traffic().ByProtocol[p2p.ProtoActivations.ID(sw.runID)].Out
	if err := old.Close(); err != nil {
		sw.log.Warn("closing a failed node", "node", v, "err", err)
	}
}

// traffic is what node v (its current identity) has sent and received on
// the relay and the stages' collectives.
func (sw *stagedSwarm) traffic(v, stages int) (sent, recv int64) {
	t := sw.live()[v].Traffic()
	ids := []string{string(p2p.ProtoActivations.ID(sw.runID))}
	for s := range stages {
		ids = append(ids, string(p2p.ProtoStageReduce(s).ID(sw.runID)))
	}
	for _, id := range ids {
		c := t.ByProtocol[protocol.ID(id)]
		sent, recv = sent+c.Out, recv+c.In
	}
	return sent, recv
}

// activationBytes is what the nodes have sent on the relay's protocol.
func (sw *stagedSwarm) activationBytes() int64 {
	n := sw.relayBytes
	for _, pn := range sw.live() {
		n += pn.Traffic().ByProtocol[p2p.ProtoActivations.ID(sw.runID)].Out
	}
	return n
}

func (sw *stagedSwarm) close() {
	for _, pn := range sw.live() {
		if pn != nil {
			pn.Close()
		}
	}
	if sw.seed != nil {
		sw.seed.Close()
	}
}

// stagePeers narrows a collective's membership to one stage's replicas.
type stagePeers struct {
	*p2p.Peers
	members []transport.PeerID
}

func (p stagePeers) Members() []transport.PeerID { return slices.Clone(p.members) }

// memBuffer is an io.WriterAt over a fixed buffer.
type memBuffer []byte

func (m memBuffer) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off > int64(len(m)) || int64(len(p)) > int64(len(m))-off {
		return 0, fmt.Errorf("experiment: write of %d bytes at %d past %d", len(p), off, len(m))
	}
	return copy(m[off:], p), nil
}
