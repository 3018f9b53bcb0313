package rabbittest

import (
	"os"
	"syscall"
)

// childAttr puts a process of the node in a process group of its own,
// which killGroup ends, and has it sent SIGTERM should the test binary
// die without stopping it (a test's timeout), so that no node outlives
// its tests.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// terminate asks p to stop.
func terminate(p *os.Process) error { return p.Signal(syscall.SIGTERM) }

// killGroup kills what is left of p's process group.
func killGroup(p *os.Process) { _ = syscall.Kill(-p.Pid, syscall.SIGKILL) }
