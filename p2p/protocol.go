package p2p

import (
	"fmt"
	"strings"

	"github.com/libp2p/go-libp2p/core/protocol"
)

// Protocol names used by this package itself.
const (
	protoMembersPacket = "members-packet"
	protoMembersStream = "members-stream"
	protoMembersBye    = "members-bye"
	protoBulk          = "bulk"
)

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
