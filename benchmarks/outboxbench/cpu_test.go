package outboxbench

import (
	"context"
	"fmt"
	neturl "net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ,
// 100 on Linux).
const clockTick = 10 * time.Millisecond

// processCPU returns the user and system CPU time that process pid has
// used, all its threads together, read from /proc; 0 when it cannot be
// read (another system, a process gone).
func processCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command, field 2, is in parentheses and may hold spaces: the
	// fields after it are counted from its closing one.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	user, _ := strconv.ParseInt(fields[11], 10, 64)
	system, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(user+system) * clockTick
}

// ownCPU returns the CPU time this process has used: the relay's (or the
// floor's), its sink's client and the benchmark's own bookkeeping.
func ownCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// listener returns the PID of the process of this machine that listens on
// the TCP port of url (a loopback address), 0 when there is none (a server
// on another machine, or one this process may not look into): the socket
// is found in /proc/net/tcp and tcp6, and its owner among the processes'
// file descriptors.
func listener(url string) int {
	u, err := neturl.Parse(url)
	if err != nil {
		return 0
	}
	host, port := u.Hostname(), u.Port()
	if port == "" || (host != "localhost" && !strings.HasPrefix(host, "127.") && host != "::1") {
		return 0
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return 0
	}
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			// local_address is "<hex address>:<hex port>"; state 0A is
			// LISTEN; the inode is the tenth field.
			if len(f) < 10 || f[3] != "0A" || !strings.HasSuffix(f[1], fmt.Sprintf(":%04X", p)) {
				continue
			}
			inodes["socket:["+f[9]+"]"] = true
		}
	}
	if len(inodes) == 0 {
		return 0
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && inodes[target] {
			pid, _ := strconv.Atoi(strings.Split(fd, "/")[2])
			return pid
		}
	}
	return 0
}

// cpuMeter measures the CPU time of a drain: the benchmark process's, the
// database server's backends that serve the sessions named app (their
// application_name), and the broker's process (0: not measured).
type cpuMeter struct {
	d      *database
	app    string
	broker int

	own, brokerCPU time.Duration
	backends       map[int]time.Duration
}

// startCPU starts measuring; on a nil d, only this process and the
// broker.
func (d *database) startCPU(b testing.TB, app string, broker int) *cpuMeter {
	b.Helper()
	m := &cpuMeter{d: d, app: app, broker: broker, own: ownCPU(), brokerCPU: processCPU(broker), backends: map[int]time.Duration{}}
	if d != nil {
		for _, pid := range d.backends(b, app) {
			m.backends[pid] = processCPU(pid)
		}
	}
	return m
}

// cpuCost is the CPU time of a drain per message, in microseconds.
type cpuCost struct {
	own, postgres, broker float64 // postgres, broker: -1 when not measured
}

// stop returns the CPU time per message of the n messages drained since
// startCPU. Call it before the sessions end: a backend's times go with
// it.
func (m *cpuMeter) stop(b testing.TB, n int) cpuCost {
	b.Helper()
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(n) }
	c := cpuCost{own: per(ownCPU() - m.own), postgres: -1, broker: -1}
	if m.d != nil {
		var pg time.Duration
		for _, pid := range m.d.backends(b, m.app) {
			pg += processCPU(pid) - m.backends[pid] // 0 for a backend started since
		}
		c.postgres = per(pg)
	}
	if m.broker != 0 {
		c.broker = per(processCPU(m.broker) - m.brokerCPU)
	}
	return c
}

// report adds c to b's metrics.
func (c cpuCost) report(b *testing.B) {
	b.ReportMetric(c.own, "proc-cpu-µs/msg")
	if c.postgres >= 0 {
		b.ReportMetric(c.postgres, "pg-cpu-µs/msg")
	}
	if c.broker >= 0 {
		b.ReportMetric(c.broker, "broker-cpu-µs/msg")
	}
}

// backends returns the PIDs of the server's backends serving the sessions
// named app; none when the server is on another machine, whose processes
// /proc does not show.
func (d *database) backends(b testing.TB, app string) []int {
	b.Helper()
	rows, err := d.pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			b.Fatal(err)
		}
		// A process of this machine only when it is the server's (a
		// server elsewhere has PIDs of its own).
		if title, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/cmdline"); err == nil && strings.HasPrefix(string(title), "postgres") {
			pids = append(pids, int(pid))
		}
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	return pids
}
