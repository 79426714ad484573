package demo

import "syscall"

// childAttr puts a child in its own process group and has the kernel kill
// it when this process dies, however it dies: no orphans, even after
// kill -9 of the demo. The kernel sends the signal when the thread that
// started the child exits (golang/go#27505); Go keeps its threads alive
// unless a goroutine exits while locked to one, which nothing in the demo
// does.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
