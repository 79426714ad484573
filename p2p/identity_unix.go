//go:build unix

package p2p

import (
	"errors"
	"syscall"
)

// oNoFollow makes opening the key fail if its last element is a link.
const oNoFollow = syscall.O_NOFOLLOW

// isLinkRefused reports whether err is the one O_NOFOLLOW gives for a link
// (ELOOP; EMLINK on some BSDs).
func isLinkRefused(err error) bool {
	return errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.EMLINK)
}
