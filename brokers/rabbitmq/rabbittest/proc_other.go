//go:build !linux

package rabbittest

import (
	"os"
	"syscall"
)

// childAttr: outside Linux, a process of the node is stopped by its PID
// alone.
func childAttr() *syscall.SysProcAttr { return nil }

// terminate asks p to stop.
func terminate(p *os.Process) error { return p.Signal(os.Interrupt) }

// killGroup kills p.
func killGroup(p *os.Process) { _ = p.Kill() }
