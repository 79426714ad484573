// Package replica owns what makes the replicas of one parameter vector one
// group: the certificate of each outer round (a strict majority of the
// round's signed group vouching for the resulting state hash), the chain
// of certificates a member trusts from the run's start state, and the rule
// by which a member adopts a state it did not compute: only one a chain of
// certificates leads to from its own (ALGORITHMS.md 8). No lone announcer,
// no fixed quorum and no set of newcomers decides.
//
// It is pure: no I/O, no clock, no goroutines. Members' signatures come
// through transport.Signer; node carries votes and chains over the network
// (p2p.ProtoVote, p2p.ProtoCerts) and downloads the certified state. It
// must not import node, p2p or optimizer. The bootstrap follows the chain
// too and countersigns its latest certificate (Anchor, p2p.ProtoAnchor),
// from which a newcomer, which has no earlier group, checks the chain.
//
// Not yet here (issue [1/4]): the outer round itself (catch up, inner
// phase, contribute, apply, publish, checkpoint), which node, the staged
// volunteer and experiment each still write; void rounds.
package replica
