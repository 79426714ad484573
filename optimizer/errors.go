package optimizer

import "errors"

// Errors of the collectives; callers test them with errors.Is.
var (
	// ErrNotMember: this member is not in the group it was asked to reduce in.
	ErrNotMember = errors.New("optimizer: self not among members")
	// ErrBadMessage: a peer sent bytes that do not decode; it is dropped.
	ErrBadMessage = errors.New("optimizer: malformed message")
	// ErrRejected: a peer's contribution failed validation (shape, finiteness
	// or norm bound) and was dropped.
	ErrRejected = errors.New("optimizer: contribution rejected")
)
