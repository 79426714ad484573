package kernels

// #cgo CFLAGS: -O3 -fopenmp -std=gnu11 -Wall -Wno-unused-function -Wno-psabi
// #cgo LDFLAGS: -fopenmp -lm -ldl
// #include "skein_kernels.h"
import "C"
