package experiment

import "syscall"

// childAttr puts a child in its own process group and has the kernel kill
// it when this process dies, however it dies: no orphans, even after
// kill -9 of the demo.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
