package attach

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
)

type recordingConn struct {
	io.ReadWriteCloser
	writes [][]byte
}

func (r *recordingConn) Write(p []byte) (int, error) {
	r.writes = append(r.writes, append([]byte(nil), p...))
	return len(p), nil
}

func muxHeader(typ byte, length uint32) []byte {
	h := make([]byte, muxHeaderSize)
	h[1] = typ
	binary.BigEndian.PutUint32(h[8:], length)
	return h
}

func TestCoalescer(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 100)
	tests := []struct {
		name   string
		writes [][]byte
		want   [][]byte // what reaches the connection
	}{
		{"data frame: one write", [][]byte{muxHeader(muxTypeData, 100), body}, [][]byte{append(muxHeader(muxTypeData, 100), body...)}},
		{"window update passes", [][]byte{muxHeader(1, 100)}, [][]byte{muxHeader(1, 100)}},
		{"empty data frame (FIN) passes", [][]byte{muxHeader(muxTypeData, 0)}, [][]byte{muxHeader(muxTypeData, 0)}},
		{"ping then data", [][]byte{muxHeader(2, 7), muxHeader(muxTypeData, 100), body}, [][]byte{muxHeader(2, 7), append(muxHeader(muxTypeData, 100), body...)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := &recordingConn{}
			c := &coalescer{ReadWriteCloser: rc}
			for _, w := range tt.writes {
				if n, err := c.Write(w); n != len(w) || err != nil {
					t.Fatalf("Write(%d bytes) = %d, %v", len(w), n, err)
				}
			}
			if len(rc.writes) != len(tt.want) {
				t.Fatalf("%d writes reached the connection, want %d", len(rc.writes), len(tt.want))
			}
			for i := range tt.want {
				if !bytes.Equal(rc.writes[i], tt.want[i]) {
					t.Errorf("write %d = %x, want %x", i, rc.writes[i], tt.want[i])
				}
			}
		})
	}
}
