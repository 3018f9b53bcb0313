//go:build unix

package redistest

import (
	"bytes"
	"fmt"
	"os"
	"syscall"
	"testing"
)

// Freeze stops the server's process with SIGSTOP, as a node that hangs:
// its port and connections stay open and the kernel still accepts new
// connections, but nothing is answered. It returns once the process is
// stopped (where /proc tells) and registers Thaw as a cleanup of t, so a
// frozen server is resumed before it is stopped.
func (s *Server) Freeze(t testing.TB) {
	t.Helper()
	pid := s.PID()
	if pid == 0 {
		t.Fatal("redistest: Freeze: the server is not running")
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("redistest: SIGSTOP %d: %v", pid, err)
	}
	t.Cleanup(s.Thaw)
	stat := fmt.Sprintf("/proc/%d/stat", pid)
	if _, err := os.Stat(stat); err != nil {
		return // no /proc: the signal is delivered at once in practice
	}
	if !WaitFor(startTimeout, func() bool {
		// The state letter follows the command name, in parentheses.
		b, err := os.ReadFile(stat)
		i := bytes.LastIndexByte(b, ')')
		return err == nil && i >= 0 && i+2 < len(b) && b[i+2] == 'T'
	}) {
		t.Fatalf("redistest: process %d not stopped after SIGSTOP", pid)
	}
}

// Thaw resumes a server stopped by Freeze (SIGCONT). Thawing a server that
// is not frozen does nothing.
func (s *Server) Thaw() {
	if pid := s.PID(); pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
}
