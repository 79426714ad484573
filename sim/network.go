package sim

import (
	"fmt"
	"math"
)

// Node is one machine of a Network, with its rates converted to the
// simulator's units.
type Node struct {
	ID     string
	Region string
	Class  string // informational: "datacenter", "home-fiber", ...
	// Speed is compute relative to the reference machine (measured.go).
	Speed float64
	// MemoryBytes is what the node offers for parameters, optimizer state
	// and stashed activations.
	MemoryBytes float64
	// UpBps and DownBps are the access link's rates in bytes per second.
	UpBps, DownBps float64
	// Access is the one-way latency of the node's last mile, in seconds.
	Access float64
}

// Link is the path from one node to another as the simulator sees it.
type Link struct {
	Latency float64 // one way, seconds
	Rate    float64 // bytes per second a bulk transfer achieves (goodput applied)
	// Pace is what a message takes beyond its serialization and the
	// latency (Spec.MessagePaceMs): it delays the message, not the
	// uplink's next one.
	Pace float64
}

// Seconds returns how long b bytes take over the link: serialization at the
// link's rate, then the latency and the pace.
func (l Link) Seconds(b float64) float64 { return l.Latency + l.Serialize(b) + l.Pace }

// Serialize returns the time b bytes occupy the sender's uplink.
func (l Link) Serialize(b float64) float64 {
	if b <= 0 {
		return 0
	}
	return b / l.Rate
}

// Network is an immutable set of nodes and the links between them. Links are
// derived, not stored: latency(i, j) = access_i + region latency + access_j,
// rate(i, j) = goodput * min(up_i, down_j), pace = Spec.MessagePaceMs.
// So a network of n nodes costs O(n + regions^2) memory, and a node joining
// or leaving changes no other node's links.
type Network struct {
	spec      Spec // what it was built from, normalized (Spec returns a copy)
	nodes     []Node
	region    []int       // per node: index into regionLatency
	latency   [][]float64 // region to region, one way, seconds
	goodput   float64
	pace      float64 // Spec.MessagePaceMs, in seconds
	indexByID map[string]int
}

// N returns the number of nodes.
func (n *Network) N() int { return len(n.nodes) }

// Name returns the network's name from its description.
func (n *Network) Name() string { return n.spec.Name }

// Node returns node i.
func (n *Network) Node(i int) Node { return n.nodes[i] }

// Index returns the index of the node with the given ID.
func (n *Network) Index(id string) (int, bool) {
	i, ok := n.indexByID[id]
	return i, ok
}

// Goodput returns the fraction of a link's rate a transfer achieves.
func (n *Network) Goodput() float64 { return n.goodput }

// Link returns the link from node i to node j. A node's link to itself has
// no latency and an infinite rate: data that stays on a node costs nothing.
func (n *Network) Link(i, j int) Link {
	if i == j {
		return Link{Latency: 0, Rate: math.Inf(1)}
	}
	a, b := n.nodes[i], n.nodes[j]
	lat := a.Access + n.latency[n.region[i]][n.region[j]] + b.Access
	return Link{
		Latency: lat,
		Rate:    n.goodput * min(a.UpBps, b.DownBps),
		Pace:    n.pace,
	}
}

// Spec returns the description the network was built from; modifying the
// copy and calling NewNetwork is how a membership change is simulated.
func (n *Network) Spec() Spec { return n.spec.clone() }

// Keep returns the network restricted to the nodes for which keep is true,
// in their original order.
func (n *Network) Keep(keep func(Node) bool) (*Network, error) {
	s := n.Spec()
	s.Nodes = s.Nodes[:0]
	for i, ns := range n.spec.Nodes {
		if keep(n.nodes[i]) {
			s.Nodes = append(s.Nodes, ns)
		}
	}
	return NewNetwork(s)
}

// NewNetwork validates a description and builds the network. It checks the
// counts against MaxNodes and MaxRegions before allocating anything sized by
// them.
func NewNetwork(s Spec) (*Network, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	regionIdx := make(map[string]int, len(s.Regions))
	for i, r := range s.Regions {
		regionIdx[r] = i
	}
	net := &Network{
		spec:      s.clone(),
		nodes:     make([]Node, len(s.Nodes)),
		region:    make([]int, len(s.Nodes)),
		latency:   make([][]float64, len(s.Regions)),
		goodput:   s.goodput(),
		pace:      s.MessagePaceMs / 1e3,
		indexByID: make(map[string]int, len(s.Nodes)),
	}
	for i, row := range s.LatencyMs {
		net.latency[i] = make([]float64, len(row))
		for j, ms := range row {
			net.latency[i][j] = ms / 1e3
		}
	}
	for i, ns := range s.Nodes {
		net.nodes[i] = ns.node()
		net.region[i] = regionIdx[ns.Region]
		net.indexByID[ns.ID] = i
	}
	return net, nil
}

func (ns NodeSpec) node() Node {
	const mbps = 1e6 / 8 // bytes per second in one Mbit/s
	return Node{
		ID:          ns.ID,
		Region:      ns.Region,
		Class:       ns.Class,
		Speed:       ns.Speed,
		MemoryBytes: ns.MemoryGiB * (1 << 30),
		UpBps:       ns.UpMbps * mbps,
		DownBps:     ns.DownMbps * mbps,
		Access:      ns.AccessMs / 1e3,
	}
}

// String names the network and its size.
func (n *Network) String() string {
	return fmt.Sprintf("%s (%d nodes, %d regions)", n.spec.Name, len(n.nodes), len(n.spec.Regions))
}
