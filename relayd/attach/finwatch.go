package attach

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
)

// finWatch follows the yamux frames a session receives and records, for each stream it
// watches, whether the peer half-closed it (a frame with the FIN flag). yamux ends a
// stream's reads with the same io.EOF when the peer half-closed it and when the session
// died under it (kl-ctl killed, the laptop asleep, keepalives failing) or it gave up
// waiting for the peer's close: a flow cut off that way must reach the workload as a
// reset, not as a clean end that makes a cut download look complete. Only a FIN tells
// them apart, and yamux does not expose it.
//
// observe is called with the bytes the session reads, before yamux sees them, so a
// stream's FIN is recorded before its reader can get the io.EOF it causes.
type finWatch struct {
	// The frame parser: only the session's reading goroutine touches it.
	hdr  [muxHeaderSize]byte
	got  int    // bytes of hdr read
	skip uint32 // bytes of a data frame's body still to pass over

	mu   sync.Mutex
	fins map[uint32]*atomic.Bool
}

// yamux's frame types and flags (its const.go).
const (
	muxTypeWindowUpdate = 1
	muxFlagFIN          = 4
)

// add watches stream id; the flag turns true when the peer's FIN arrives.
func (w *finWatch) add(id uint32) *atomic.Bool {
	fin := new(atomic.Bool)
	w.mu.Lock()
	if w.fins == nil {
		w.fins = map[uint32]*atomic.Bool{}
	}
	w.fins[id] = fin
	w.mu.Unlock()
	return fin
}

// remove stops watching stream id.
func (w *finWatch) remove(id uint32) {
	w.mu.Lock()
	delete(w.fins, id)
	w.mu.Unlock()
}

// observe follows the frames in p, the next bytes the session read.
func (w *finWatch) observe(p []byte) {
	for len(p) > 0 {
		if w.skip > 0 {
			n := len(p)
			if uint64(n) > uint64(w.skip) {
				n = int(w.skip)
			}
			p, w.skip = p[n:], w.skip-uint32(n)
			continue
		}
		n := copy(w.hdr[w.got:], p)
		p, w.got = p[n:], w.got+n
		if w.got < muxHeaderSize {
			return
		}
		w.got = 0
		typ, flags := w.hdr[1], binary.BigEndian.Uint16(w.hdr[2:4])
		id, length := binary.BigEndian.Uint32(w.hdr[4:8]), binary.BigEndian.Uint32(w.hdr[8:12])
		if typ == muxTypeData {
			w.skip = length // a window update's length is the window's increment
		}
		if (typ == muxTypeData || typ == muxTypeWindowUpdate) && flags&muxFlagFIN != 0 {
			w.mu.Lock()
			fin := w.fins[id]
			w.mu.Unlock()
			if fin != nil {
				fin.Store(true)
			}
		}
	}
}
