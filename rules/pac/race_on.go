//go:build race

package pac

// raceEnabled: built with -race. sync.Pool then drops a quarter of what it is given on
// purpose, and a runtime dropped that way only comes back at the next garbage
// collection; an idle test process may not collect for a long time. So with -race an
// inline pool keeps its idle runtimes in the channel only (local.go).
const raceEnabled = true
