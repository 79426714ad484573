//go:build !amd64

package optimizer

const hasFWHTAsm = false

func fwhtAsm(a []float32) { fwhtGeneric(a) }
