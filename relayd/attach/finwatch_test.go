package attach

import (
	"encoding/binary"
	"testing"
)

func muxFrame(typ byte, flags uint16, id uint32, body []byte, length uint32) []byte {
	b := make([]byte, muxHeaderSize, muxHeaderSize+len(body))
	b[1] = typ
	binary.BigEndian.PutUint16(b[2:4], flags)
	binary.BigEndian.PutUint32(b[4:8], id)
	binary.BigEndian.PutUint32(b[8:12], length)
	return append(b, body...)
}

// TestFinWatch: the watch finds the FIN of each watched stream in the frames however
// the reads cut them, and never in a data frame's body.
func TestFinWatch(t *testing.T) {
	// A body that holds a FIN header for stream 3, which must not count.
	fake := muxFrame(muxTypeData, muxFlagFIN, 3, nil, 0)
	var in []byte
	in = append(in, muxFrame(muxTypeWindowUpdate, 1, 3, nil, 1<<20)...) // SYN, window
	in = append(in, muxFrame(muxTypeData, 0, 3, fake, uint32(len(fake)))...)
	in = append(in, muxFrame(2, 0, 0, nil, 7)...)                              // ping
	in = append(in, muxFrame(muxTypeData, muxFlagFIN, 5, []byte("end"), 3)...) // data and FIN
	in = append(in, muxFrame(muxTypeWindowUpdate, muxFlagFIN, 7, nil, 0)...)   // a bare FIN
	in = append(in, muxFrame(muxTypeWindowUpdate, muxFlagFIN, 9, nil, 0)...)   // not watched
	want := map[uint32]bool{3: false, 5: true, 7: true, 11: false}
	for _, chunk := range []int{1, 5, 12, 13, 64, len(in)} {
		w := &finWatch{}
		got := map[uint32]func() bool{}
		for id := range want {
			got[id] = w.add(id).Load
		}
		for p := in; len(p) > 0; {
			n := min(chunk, len(p))
			w.observe(p[:n])
			p = p[n:]
		}
		for id, fin := range want {
			if got[id]() != fin {
				t.Errorf("reads of %d bytes: FIN of stream %d = %v, want %v", chunk, id, got[id](), fin)
			}
		}
		if len(w.fins) != len(want) {
			t.Errorf("reads of %d bytes: %d streams watched, want %d", chunk, len(w.fins), len(want))
		}
		w.remove(5)
		if _, ok := w.fins[5]; ok {
			t.Errorf("stream 5 still watched after remove")
		}
	}
}
