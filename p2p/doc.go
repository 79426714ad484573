// Package p2p is Skein's network layer for volunteers on the open internet: one
// identity, one UDP port, NAT traversal and gossip membership. It knows bytes
// and peers, not tensors.
//
// # What it owns
//
//   - the libp2p host (QUIC-v1 plus TCP fallback, relay v2, hole punching,
//     AutoNAT, resource and connection managers) and its ed25519 identity, kept in
//     the node's data directory (host.go, identity.go);
//   - membership: hashicorp/memberlist carried on libp2p streams, node names are
//     peer IDs (transport.go, membership.go), node metadata signed by the
//     node's identity key with its address and incarnation, so no peer can
//     gossip another's, move it or replay an older one (meta.go,
//     metasig.go); a member counts (Members) only once it proved itself
//     live over a direct connection to this node, until then it is pending
//     (admit.go); the
//     persisted peer book used to rejoin without the bootstrap (peerbook.go);
//     memberlist's unsigned suspect and dead messages are not taken on
//     their word: a member declared failed stays listed while it answers a
//     direct libp2p ping, and the node warns, naming who declared it
//     (dispute.go, accusation.go);
//   - protocol IDs /skein/<run-id>/<name>/<version> (protocol.go), typed
//     length-prefixed frames (frame.go, stream.go) and bulk transfers of large
//     byte ranges, striped over streams and connections and resumable (bulk.go,
//     lanes.go);
//   - admission: a run's policy, open (caps per address prefix, measured on
//     the member's connection, and in total) or closed (join tokens signed by the run key), enforced by
//     every member in membership, on every run protocol stream (one gate)
//     and at the admission handshake (admission.go, admit.go, runkey.go);
//   - per-peer and per-protocol byte accounting (accounting.go);
//   - the bootstrap seed (seed.go) and a volunteer node (node.go).
//
// WAN emulation (latency, jitter, bandwidth, loss) lives in p2p/wan; an in-process
// swarm for tests of other packages lives in p2p/p2ptest.
//
// It must not know about tensors, models or optimizers: payloads are []byte and
// io.ReaderAt/io.WriterAt.
//
// # Contract for callers
//
//  1. Create one Seed per run (NewSeed) and print Seed.FullAddr for volunteers.
//  2. Each volunteer calls NewNode with the seed's address; NewNode returns once
//     the node has joined (or fails with ErrWrongRun, ErrNoSeed, a
//     *NotAdmittedError ...). In a closed run it needs NodeConfig.Token.
//  3. Subscribe to membership events with Node.Subscribe; events arrive in order.
//  4. Register protocols with Node.Handle before peers use them; open them with
//     Node.Open. Every frame has a size limit and every read/write a deadline.
//  5. Call Node.Close (graceful leave) on shutdown.
//
// # Timing
//
// WANTiming (the default, for production) is memberlist's WAN profile: probe
// every 5 s with a 3 s timeout, suspicion multiplier 6 (max x6), gossip every
// 500 ms to 4 members, push/pull every 60 s, 30 s stream timeout, dead-node
// reclaim after 10 s. A killed node is declared failed after roughly 40 s; a
// graceful leave propagates in about a second. LANTiming (1 s probes) declares
// failure in ~6-8 s. FastTiming (tests on loopback: 300 ms probes, 250 ms
// timeout, suspicion x3 max x2, 50 ms gossip, push/pull 3 s) declares failure
// in 1-3 s, plus up to 2 s for the direct check every member makes before
// believing a failure (dispute.go); Timing.FailureWindow(n) states the bound
// the tests check.
//
// # Bounded state
//
// A seed runs for weeks and meets many short-lived or hostile peers, so every
// table that remote peers feed is bounded: goodbyes awaiting a leave expire
// after a minute and number at most 1024 (membership.go); memberlist's
// address index keeps 1024 addresses, least recently used evicted first, and
// drops a member's addresses when it leaves or fails, or when the node
// forgets the peer (transport.go); the peer book keeps the
// NodeConfig.PeerBookSize most recently seen peers (peerbook.go);
// per-(peer, protocol) byte counters are folded into per-protocol totals once
// idle and disconnected, at most 8192 at a time (accounting.go); disputed
// failures, each with its checking goroutine, number at most 256
// (dispute.go); the suspect and dead messages recorded to name their
// senders keep 4 per accused peer for 1024 peers, a minute at most
// (accusation.go).
//
// libp2p's peerstore holds the members, the connected peers and the peers
// seen in the last NodeConfig.ForgetAfter (15 min by default), nothing more
// (peerstore.go). A member's addresses from membership (QUIC, TCP, relayed
// through the seeds) are pinned at PermanentAddrTTL while it is a member,
// however long its connection is down, and lowered to
// RecentlyConnectedAddrTTL when it leaves or fails. Every RejoinInterval the
// node removes (ClearAddrs, RemovePeer) each peer that has been neither a
// member nor connected for ForgetAfter: libp2p alone drops keys and
// protocols a minute after a disconnect but never a lowered address, so a
// seed would keep every peer it ever met. Seeds are never removed; peer-book
// peers need no peerstore entry (a rejoin dials the addresses the book
// stores). The record of idle peers is rebuilt from the peerstore on every
// sweep.
//
// # Relayed connections
//
// A seed relays with explicit limits (Limits.RelayDuration, RelayData: 10 min
// and 4 MiB per direction by default): enough for membership and control
// traffic of nodes that cannot hole punch. Streams over relayed (limited)
// connections need network.WithAllowLimitedConn in ctx; membership uses it,
// Open and Fetch only when the caller asks. Bulk data should go direct.
package p2p
