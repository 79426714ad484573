package p2p

import (
	"fmt"
	"strings"

	"github.com/libp2p/go-libp2p/core/protocol"
)

// Protocol names one protocol of a run; on the wire it is
// /skein/<run>/<Name>/<Version> (see ID). Every protocol a run speaks is in
// the table below, and nowhere else, so a reader sees them all at once.
type Protocol struct {
	Name    string
	Version int
}

// ID returns /skein/<runID>/<name>/<version>.
func (p Protocol) ID(runID string) protocol.ID { return ProtocolID(runID, p.Name, p.Version) }

// String returns name/version.
func (p Protocol) String() string { return fmt.Sprintf("%s/%d", p.Name, p.Version) }

// The protocols of a run.
var (
	// ProtoMembersPacket carries one memberlist packet per stream.
	ProtoMembersPacket = Protocol{"members-packet", 1}
	// ProtoMembersStream carries memberlist's push/pull state exchange.
	ProtoMembersStream = Protocol{"members-stream", 1}
	// ProtoMembersBye is a leaving member's goodbye (leave, not failure).
	ProtoMembersBye = Protocol{"members-bye", 1}
	// ProtoBulk is the striped, resumable bulk transfer (states, shards).
	ProtoBulk = Protocol{"bulk", 1}
	// ProtoReduce carries the DiLoCo collective's messages (the butterfly).
	ProtoReduce = Protocol{"reduce", 1}
	// ProtoGossip carries NoLoCo's partial averaging with random peers.
	ProtoGossip = Protocol{"gossip", 1}
	// ProtoManifest serves the run's manifest (its canonical bytes, which
	// the asker hashes).
	ProtoManifest = Protocol{"manifest", 1}
	// ProtoTelemetry carries volunteers' per-round reports to the bootstrap.
	ProtoTelemetry = Protocol{"telemetry", 1}
	// ProtoActivations carries a staged run's SkipPipe relay: activations
	// forward and their gradients backward along microbatch paths
	// (pipeline.Relay's messages).
	ProtoActivations = Protocol{"activations", 1}
	// ProtoAdmission is the admission handshake (admit.go): a node presents
	// its join token and learns the run's policy. The only protocol a peer
	// that is not admitted may open.
	ProtoAdmission = Protocol{"admission", 1}
	// ProtoStagePlan serves a staged run's placement (pipeline.Assignment):
	// which volunteer serves which stage from which iteration on. The
	// bootstrap answers; volunteers ask it.
	ProtoStagePlan = Protocol{"stage-plan", 1}
	// ProtoClock answers the bootstrap's clock (8 bytes, Unix nanoseconds,
	// big-endian): `skein node doctor` measures this machine's skew.
	ProtoClock = Protocol{"clock", 1}
	// ProtoUploadProbe takes filler chunks and answers how fast they
	// arrived (upload.go): `skein node doctor` measures this machine's
	// upload rate against the bootstrap.
	ProtoUploadProbe = Protocol{"upload-probe", 1}
	// ProtoVote carries a member's signed vote for the state its round
	// ended in (a replica.Certificate with its signature alone) to the
	// round's other members, one frame per stream.
	ProtoVote = Protocol{"vote", 1}
	// ProtoCerts serves the chain of round certificates a member trusts:
	// the asker sends the round it trusts (8 bytes), the answer is one
	// frame per certificate after it, oldest first.
	ProtoCerts = Protocol{"certs", 1}
	// ProtoAnchor serves the round certificate the bootstrap last
	// countersigned (a replica.Anchor, one frame; empty while it has none):
	// a newcomer checks the announcers' chain from it.
	ProtoAnchor = Protocol{"anchor", 1}
)

// ProtoStageReduce carries the DiLoCo collective of stage s's replicas in a
// staged run: one protocol per stage, so that each stage's butterfly only
// ever hears its own stage.
func ProtoStageReduce(s int) Protocol { return Protocol{fmt.Sprintf("reduce-stage%d", s), 1} }

// MaxRunIDLen bounds a run id (it rides in node metadata and protocol IDs).
const MaxRunIDLen = 64

// ValidateRunID checks that id is 1..MaxRunIDLen characters of [A-Za-z0-9._-].
func ValidateRunID(id string) error {
	if id == "" || len(id) > MaxRunIDLen {
		return fmt.Errorf("p2p: run id %q: length %d out of range [1, %d]", id, len(id), MaxRunIDLen)
	}
	for _, c := range id {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return fmt.Errorf("p2p: run id %q: character %q not in [A-Za-z0-9._-]", id, c)
		}
	}
	return nil
}

// ProtocolID returns /skein/<runID>/<name>/<version>.
func ProtocolID(runID, name string, version int) protocol.ID {
	return protocol.ID(fmt.Sprintf("/skein/%s/%s/%d", runID, name, version))
}

// runOfProtocol returns the run id of a /skein/<run>/... protocol, or "".
func runOfProtocol(p protocol.ID) string {
	s, ok := strings.CutPrefix(string(p), "/skein/")
	if !ok {
		return ""
	}
	run, _, ok := strings.Cut(s, "/")
	if !ok {
		return ""
	}
	return run
}
