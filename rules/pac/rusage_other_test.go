//go:build !unix

package pac

import "time"

// cpuTime is not measured on this system; the benchmarks then report wall time only.
func cpuTime() time.Duration { return 0 }
