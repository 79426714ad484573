//go:build !amd64

package compression

const hasSignAsm = false

func signBlocksAsm(dst []float32, scales []byte, bits []byte, block int) int { return 0 }
