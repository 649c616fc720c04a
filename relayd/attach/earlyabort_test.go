package attach

import "testing"

// TestAbortBeforeCarried: the daemon's abort of a flow the attach side has reserved
// but not set its abort for yet (the daemon may end a flow as soon as it has read the
// verdict) still cuts the flow, once.
func TestAbortBeforeCarried(t *testing.T) {
	tests := []struct {
		name  string
		early bool // the abort comes before the flow is carried
	}{
		{"before the flow is carried", true},
		{"after the flow is carried", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Client{live: map[flowKey]*liveFlow{}}
			lf, release := c.reserve("s", 7)
			defer release()
			if tt.early {
				c.abort("s", 7)
			}
			cut := 0
			lf.setCut(func() { cut++ })
			if !tt.early {
				c.abort("s", 7)
			}
			if cut != 1 {
				t.Errorf("the flow was cut %d times, want once", cut)
			}
		})
	}
}

// TestResetBeforeCarried: the attach side's reset of a flow whose verdict the daemon
// has not taken yet marks the flow reset once it is carried, and is given up with it.
func TestResetBeforeCarried(t *testing.T) {
	se := &session{live: map[uint64]*flowConn{}}
	if !se.reserve(7) {
		t.Fatal("reserve refused a free id")
	}
	se.reset(7)
	fc := se.track(&flowConn{se: se, id: 7})
	if !fc.peerReset.Load() {
		t.Error("the reset that came before the flow was carried was lost")
	}
	se.release(7, fc)
	if len(se.live) != 0 || len(se.resetEarly) != 0 {
		t.Errorf("ids still held after the flow ended: %v, %v", se.live, se.resetEarly)
	}
}
