//go:build !linux

package demo

import "syscall"

// childAttr puts a child in its own process group. Outside Linux there is
// no parent-death signal: children of a demo killed with SIGKILL outlive it.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
