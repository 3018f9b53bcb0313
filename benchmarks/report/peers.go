package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// peersPkg is the command that measures the peers, in the benchmarks
// module; peersFile, in results/, keeps its output.
const (
	peersPkg  = "./peers"
	peersFile = "peers.txt"
)

var peersPage = page{
	file:  "peers.md",
	title: "Peers",
	about: "this middleware and fiber's middleware/idempotency, each against its own bare handler over loopback",
	body:  peersBody,
}

// peersArgs are the arguments of the peers command.
func peersArgs(c config) []string {
	if c.quick {
		return []string{"-duration", "300ms", "-rounds", "1"}
	}
	// Twice as many rounds of half the time: the same time in all, and a
	// median over more alternations of the two targets, which drifts less
	// with the machine's load.
	return []string{"-duration", (c.duration / 2).String(), "-rounds", fmt.Sprint(2*c.rounds + 1)}
}

// runPeers runs the side-by-side comparison of the peers command and
// returns its output, also kept in results/.
func runPeers(c config, root string) (string, error) {
	args := append([]string{"run", peersPkg}, peersArgs(c)...)
	fmt.Fprintf(os.Stderr, "report: %s\n", shellCommand(true, "go", args...))
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Join(root, toolsDir)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w", peersPkg, err)
	}
	return string(out), os.WriteFile(filepath.Join(root, filepath.FromSlash(resultsDir), peersFile), out, 0o644)
}

func peersBody(ms *measured, d *doc) {
	if ms.peers == "" {
		d.para("Not measured in this run.")
		return
	}
	d.block("sh", shellCommand(true, "go", append([]string{"run", peersPkg}, peersArgs(ms.c)...)...))
	d.para("The peers command (in the benchmarks module, so the peers stay out of the library's dependencies) serves each stack's bare handler and the same handler behind that stack's idempotency middleware on loopback, drives both with the same client, first with new keys and then with completed keys, and reports the middleware's throughput as a fraction of its own bare handler's. The stacks have different HTTP servers, so the fraction, not the absolute rate, compares the middleware. The peer measured is fiber's `middleware/idempotency` (on fasthttp, in-memory storage and locker), the only Go idempotency middleware the module proxy here serves. It does less per request than this middleware: it keeps no request fingerprint, so a reused key with another request replays the first response instead of answering 422; it stores 5xx responses as well, so a retry after a server error gets the error again; and its default lock works within one process, so a duplicate waits for the original instead of getting 409, and two processes can run the same key at once. The storage key is the client's key as sent.")
	d.block("", strings.TrimRight(ms.peers, "\n"))
}
