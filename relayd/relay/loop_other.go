//go:build !linux

package relay

// Event loops are Linux-only: every flow goes on goroutines.
type (
	loop struct{}
	lpod struct{}
)

func (r *Relay) openOnLoop(*pod) (bool, error) { return false, nil }
func (p *pod) closeLoopListener()              {}
func (p *pod) closeLoopFlows()                 {}
func (r *Relay) stopLoops()                    {}
