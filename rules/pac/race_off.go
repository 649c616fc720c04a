//go:build !race

package pac

// raceEnabled: built with -race (see race_on.go).
const raceEnabled = false
