//go:build !unix

package redisbench

import "time"

// processCPU is not measured here: the benchmarks then report no
// proc-cpu-µs/op.
func processCPU() time.Duration { return 0 }
