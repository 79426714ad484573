package optimizer

import "golang.org/x/sys/cpu"

// hasFWHTAsm says fwht runs fwhtAVX2.
var hasFWHTAsm = cpu.X86.HasAVX2

//go:noescape
func fwhtAVX2(a *float32, n int)

// fwhtAsm is fwht for a power of two of at least 8 values.
func fwhtAsm(a []float32) { fwhtAVX2(&a[0], len(a)) }
