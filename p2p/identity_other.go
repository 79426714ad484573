//go:build !unix

package p2p

// oNoFollow is 0 where the platform has no O_NOFOLLOW; the Lstat before
// opening refuses a link there.
const oNoFollow = 0

func isLinkRefused(error) bool { return false }
