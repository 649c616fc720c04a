package upstream

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// fakeSOCKS is a scripted SOCKS5 server: it records the greeting and request and answers
// with the given method, auth status and reply code. With ahead set it reads the whole
// client side (greeting, credentials, request) before it answers anything, as a server
// that reads ahead may: only a pipelining client gets through it.
type fakeSOCKS struct {
	method   byte
	authOK   bool
	reply    byte
	replyTyp byte // address type in the reply
	ahead    bool
	requests chan []byte
}

func (f *fakeSOCKS) handle(c net.Conn) {
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(c, methods); err != nil {
		return
	}
	var held []byte
	answer := func(b ...byte) {
		if f.ahead {
			held = append(held, b...)
			return
		}
		_, _ = c.Write(b)
	}
	flush := func() { _, _ = c.Write(held) }
	answer(5, f.method)
	if f.method == 0xff || !bytes.Contains(methods, []byte{f.method}) {
		flush()
		return
	}
	if f.method == 2 {
		var b [1]byte
		_, _ = io.ReadFull(c, b[:]) // version
		_, _ = io.ReadFull(c, b[:])
		_, _ = io.ReadFull(c, make([]byte, b[0]))
		_, _ = io.ReadFull(c, b[:])
		_, _ = io.ReadFull(c, make([]byte, b[0]))
		if !f.authOK {
			answer(1, 1)
			flush()
			return
		}
		answer(1, 0)
	}
	req := make([]byte, 4)
	if _, err := io.ReadFull(c, req); err != nil {
		return
	}
	var rest []byte
	switch req[3] {
	case 1:
		rest = make([]byte, 4+2)
	case 4:
		rest = make([]byte, 16+2)
	case 3:
		var l [1]byte
		_, _ = io.ReadFull(c, l[:])
		req = append(req, l[0])
		rest = make([]byte, int(l[0])+2)
	}
	_, _ = io.ReadFull(c, rest)
	f.requests <- append(req, rest...)
	resp := []byte{5, f.reply, 0}
	switch f.replyTyp {
	case 3:
		resp = append(resp, 3, 9)
		resp = append(resp, "localhost"...)
	case 4:
		resp = append(resp, 4)
		resp = append(resp, make([]byte, 16)...)
	default:
		resp = append(resp, 1, 127, 0, 0, 1)
	}
	resp = append(resp, 0x1f, 0x90)
	// The tunnel's first byte goes out in the same segment as the reply: it must not be lost.
	if f.reply == 0 {
		resp = append(resp, '!')
	}
	answer(resp...)
	flush()
	if f.reply == 0 {
		_, _ = io.Copy(c, c)
	}
}

func TestSOCKS5(t *testing.T) {
	tests := []struct {
		name    string
		srv     fakeSOCKS
		creds   string
		target  Target
		wantReq []byte
		wantErr error
		errText string
		// pipelineOnly: the case differs without pipelining (a client that offers both
		// methods accepts no-auth) and runs pipelined only.
		pipelineOnly bool
	}{
		{name: "domain", srv: fakeSOCKS{method: 0},
			target:  Target{Host: "example.com", Addr: netip.MustParseAddrPort("192.0.2.1:443"), Port: 443},
			wantReq: append(append([]byte{5, 1, 0, 3, 11}, "example.com"...), 1, 0xbb)},
		{name: "ipv4", srv: fakeSOCKS{method: 0, replyTyp: 3},
			target:  Target{Addr: netip.MustParseAddrPort("192.0.2.1:80"), Port: 80},
			wantReq: []byte{5, 1, 0, 1, 192, 0, 2, 1, 0, 80}},
		{name: "ipv6 with auth", srv: fakeSOCKS{method: 2, authOK: true, replyTyp: 4}, creds: "u:p@",
			target:  Target{Addr: netip.MustParseAddrPort("[2001:db8::2]:8443"), Port: 8443},
			wantReq: append(append([]byte{5, 1, 0, 4}, netip.MustParseAddr("2001:db8::2").AsSlice()...), 0x20, 0xfb)},
		{name: "ip literal host", srv: fakeSOCKS{method: 0},
			target:  Target{Host: "10.1.2.3", Port: 22},
			wantReq: []byte{5, 1, 0, 1, 10, 1, 2, 3, 0, 22}},
		{name: "auth rejected", srv: fakeSOCKS{method: 2, authOK: false}, creds: "u:bad@",
			target: Target{Host: "h", Port: 1}, wantErr: ErrAuth, errText: "username/password rejected"},
		{name: "auth required", srv: fakeSOCKS{method: 0xff},
			target: Target{Host: "h", Port: 1}, wantErr: ErrAuth, errText: "requires authentication"},
		{name: "not allowed", srv: fakeSOCKS{method: 0, reply: 2},
			target: Target{Host: "h", Port: 1}, wantErr: ErrRefused, errText: "connection not allowed by ruleset"},
		{name: "refused", srv: fakeSOCKS{method: 0, reply: 5},
			target: Target{Host: "h", Port: 1}, wantErr: ErrRefused, errText: "connection refused"},
		{name: "host unreachable", srv: fakeSOCKS{method: 0, reply: 4},
			target: Target{Host: "h", Port: 1}, wantErr: ErrRefused, errText: "host unreachable"},
		{name: "unknown code", srv: fakeSOCKS{method: 0, reply: 0x42},
			target: Target{Host: "h", Port: 1}, wantErr: ErrRefused, errText: "unknown reply 0x42"},
		{name: "method not offered", srv: fakeSOCKS{method: 2},
			target: Target{Host: "h", Port: 1}, wantErr: ErrProtocol, errText: "did not offer"},
		{name: "no-auth chosen over offered credentials", srv: fakeSOCKS{method: 0}, creds: "u:p@", pipelineOnly: true,
			target: Target{Host: "h", Port: 1}, wantErr: ErrProtocol, errText: "did not offer"},
		{name: "long host", srv: fakeSOCKS{method: 0},
			target: Target{Host: strings.Repeat("a", 256), Port: 1}, wantErr: ErrTarget, errText: "256 bytes"},
	}
	for _, tt := range tests {
		for _, pipeline := range []bool{false, true} {
			if tt.pipelineOnly && !pipeline {
				continue
			}
			name := tt.name
			var opts []Option
			if pipeline {
				// Against a server that answers only once it has read the request: a
				// client that waited for each answer would time out.
				name, opts = name+"/pipelined", []Option{Pipeline()}
			}
			t.Run(name, func(t *testing.T) {
				srv := tt.srv
				srv.ahead = pipeline
				srv.requests = make(chan []byte, 1)
				addr := fakeServer(t, srv.handle)
				d, err := New("socks5://"+tt.creds+addr, time.Second, nil, opts...)
				if err != nil {
					t.Fatal(err)
				}
				c, err := d.Dial(context.Background(), tt.target)
				if tt.wantErr != nil {
					if err == nil {
						_ = c.Close()
						t.Fatalf("Dial = nil error, want %v", tt.wantErr)
					}
					if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.errText) || !strings.Contains(err.Error(), d.String()) {
						t.Fatalf("Dial error %q, want %v naming %s and containing %q", err, tt.wantErr, d, tt.errText)
					}
					return
				}
				if err != nil {
					t.Fatalf("Dial: %v", err)
				}
				defer func() { _ = c.Close() }()
				if got := <-srv.requests; !bytes.Equal(got, tt.wantReq) {
					t.Errorf("request = % x, want % x", got, tt.wantReq)
				}
				_ = c.SetDeadline(time.Now().Add(2 * time.Second))
				_, _ = c.Write([]byte("x"))
				buf := make([]byte, 2)
				if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "!x" {
					t.Fatalf("tunnel read %q, %v; want %q", buf, err, "!x")
				}
			})
		}
	}
}

// TestSOCKS5AheadNeedsPipeline shows the read-ahead server of TestSOCKS5's pipelined cases
// tells the two clients apart: one that waits for each answer gets none from it.
func TestSOCKS5AheadNeedsPipeline(t *testing.T) {
	srv := fakeSOCKS{method: 0, ahead: true, requests: make(chan []byte, 1)}
	d, err := New("socks5://"+fakeServer(t, srv.handle), 200*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Dial(context.Background(), Target{Host: "h", Port: 1})
	if err == nil {
		_ = c.Close()
		t.Fatal("a client waiting for the method choice got through a server that answers only after the request")
	}
	if !strings.Contains(err.Error(), "read SOCKS5 method: timed out") {
		t.Fatalf("Dial error %q, want a timeout reading the method", err)
	}
}
