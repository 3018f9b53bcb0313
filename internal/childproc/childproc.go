// Package childproc runs the child processes of the proofs that kill
// processes with SIGKILL (brokers/nats, brokers/outboxproof): the test
// binary itself running one of its test functions (a consumer, a relay),
// or a program built for the test. A child reports lines on its stdout
// ("<prefix>KIND TEXT", written with a Reporter) that the parent collects
// in Lines; it exits when the parent does (WatchLifeline), so that none
// outlives a test.
package childproc

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Line is what a child process reported: "<prefix>KIND TEXT".
type Line struct {
	From *Process
	Kind string
	Text string
}

// Lines collects the lines of child processes, in order.
type Lines struct {
	// Notify has a value when lines are waiting to be taken.
	Notify chan struct{}

	mu  sync.Mutex
	got []Line
}

// NewLines returns an empty Lines.
func NewLines() *Lines { return &Lines{Notify: make(chan struct{}, 1)} }

func (l *Lines) add(x Line) {
	l.mu.Lock()
	l.got = append(l.got, x)
	l.mu.Unlock()
	select {
	case l.Notify <- struct{}{}:
	default:
	}
}

// Take returns the lines added since the last call.
func (l *Lines) Take() []Line {
	l.mu.Lock()
	defer l.mu.Unlock()
	got := l.got
	l.got = nil
	return got
}

// Process is a child process of a test.
type Process struct {
	Name   string
	cmd    *exec.Cmd
	exited chan struct{}
}

// Self returns the command that runs this test binary's test function
// named test in a child process.
func Self(test string) (string, []string) {
	return os.Args[0], []string{"-test.run=^" + test + "$", "-test.count=1"}
}

// Start starts bin with args and env (added to this process's), adding
// the lines it prints that start with prefix to l (when l is not nil),
// and keeping its stderr in a file of t's temporary directory, whose last
// lines are logged when t fails. Its standard input is a pipe this process
// holds, which closes when the test binary exits, so that a child that
// calls WatchLifeline never outlives the test. The process is killed when
// t ends if it still runs.
func Start(t testing.TB, name, prefix, bin string, args, env []string, l *Lines) *Process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	logPath := filepath.Join(t.TempDir(), name+".log")
	stderr, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = stderr
	stdin, lifeline, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = stdin
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	p := &Process{Name: name, cmd: cmd, exited: make(chan struct{})}
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), prefix); ok && l != nil {
				kind, text, _ := strings.Cut(rest, " ")
				l.add(Line{From: p, Kind: kind, Text: text})
			}
		}
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
		stderr.Close()
	}()
	t.Cleanup(func() {
		p.Kill()
		lifeline.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil && len(b) > 0 {
				t.Logf("%s's stderr (last lines):\n%s", name, tail(string(b), 15))
			}
		}
	})
	return p
}

// Kill sends the process SIGKILL, by its PID, and waits for it to exit.
func (p *Process) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Stop asks the process to stop (SIGTERM) and waits for it, killing it
// after grace.
func (p *Process) Stop(grace time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		p.Kill()
	}
}

// Exited is closed once the process has exited and its output was read.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// WatchLifeline, called in a child process, exits it when its standard
// input closes: the test that started it has ended.
func WatchLifeline() {
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(2)
	}()
}

// Reporter prints a child's lines for its parent, one at a time.
type Reporter struct {
	Prefix string
	mu     sync.Mutex
}

// Report prints "<prefix>KIND TEXT", the text formatted as fmt.Printf
// does.
func (r *Reporter) Report(kind, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Printf(r.Prefix+kind+" "+format+"\n", args...)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}
