package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"testing"
)

// statuses reads answers from br until the proxy closes the connection and returns
// their status codes, interim answers included.
func statuses(t *testing.T, br *bufio.Reader) []int {
	t.Helper()
	var got []int
	for range 10 {
		if _, err := br.Peek(1); errors.Is(err, io.EOF) {
			return got
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("after answers %v: %v", got, err)
		}
		got = append(got, resp.StatusCode)
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatalf("body of answer %d: %v", resp.StatusCode, err)
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			_, _ = io.Copy(io.Discard, br) // the tunnel: the origin closes it
			return got
		}
	}
	t.Fatalf("more than 10 answers: %v", got)
	return nil
}

// TestHTTPForwardInterimToHTTP10: an HTTP/1.0 client gets no 1xx answer (RFC 9110
// §15.2): the origin's interim answers are read and dropped, the proxy sends no 100
// Continue of its own, and an upgrade is not forwarded. An HTTP/1.1 client still gets
// them. (Before, the HTTP/1.0 client got every 1xx.)
func TestHTTPForwardInterimToHTTP10(t *testing.T) {
	const final = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	tests := []struct {
		name   string
		req    string // the request to i.test, ending the connection after its answer
		answer string // what the origin sends back
		want   []int
	}{
		{"103 to HTTP/1.1", "GET http://i.test/ HTTP/1.1\r\nConnection: close\r\n\r\n",
			"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n" + final, []int{103, 200}},
		{"103 to HTTP/1.0", "GET http://i.test/ HTTP/1.0\r\n\r\n",
			"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n" + final, []int{200}},
		{"unasked 100 and 103 to HTTP/1.0", "GET http://i.test/ HTTP/1.0\r\n\r\n",
			"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n" + final, []int{200}},
		{"Expect 100-continue from HTTP/1.1", "POST http://i.test/ HTTP/1.1\r\nConnection: close\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
			"HTTP/1.1 100 Continue\r\n\r\n" + final, []int{100, 200}},
		{"Expect 100-continue from HTTP/1.0", "POST http://i.test/ HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
			"HTTP/1.1 100 Continue\r\n\r\n" + final, []int{200}},
		{"upgrade from HTTP/1.1", "GET http://i.test/ HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
			"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", []int{101}},
		{"upgrade from HTTP/1.0", "GET http://i.test/ HTTP/1.0\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
			"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", []int{502}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld()
			w.origin(t, "i.test", func(c net.Conn) {
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				_, _ = io.WriteString(c, tt.answer)
			})
			httpAddr, _ := w.serve(t, nil)
			c, br := dialProxy(t, httpAddr)
			if _, err := io.WriteString(c, tt.req); err != nil {
				t.Fatal(err)
			}
			if got := statuses(t, br); !slices.Equal(got, tt.want) {
				t.Fatalf("answers %v, want %v", got, tt.want)
			}
		})
	}
}
