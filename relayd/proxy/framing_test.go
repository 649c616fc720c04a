package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// statuses reads answers from br until the proxy ends the connection and returns
// their status codes, interim answers included.
func statuses(t *testing.T, br *bufio.Reader) []int {
	t.Helper()
	var got []int
	for range 10 {
		// The proxy ends the connection with a FIN after its last answer (lingerClose),
		// also with bytes of a refused request left unread: a reset fails the test.
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

// lastGet is a request to a.test, the last on its connection, whose header (request
// line to the empty line) is n bytes long.
func lastGet(t *testing.T, n int) string {
	t.Helper()
	start := "GET http://a.test/last HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\nX-Pad: "
	pad := n - len(start) - len("\r\n\r\n")
	if pad < 1 {
		t.Fatalf("a header of %d bytes is too short for the request", n)
	}
	return start + strings.Repeat("p", pad) + "\r\n\r\n"
}

// TestHTTPPipelinedHeaderBound: a request's header is bounded by MaxHeaderBytes whether
// it arrives alone or pipelined behind another request (its start already buffered while
// the one before was read or answered, even whole when that one had a body): the same
// sizes get through and the same get 431. (Before, the buffered bytes were not counted,
// so a pipelined header could exceed the bound by up to 4 KiB.)
func TestHTTPPipelinedHeaderBound(t *testing.T) {
	const post = "POST http://a.test/one HTTP/1.1\r\nHost: a.test\r\nContent-Length: 10\r\n\r\n0123456789"
	const get = "GET http://a.test/one HTTP/1.1\r\nHost: a.test\r\n\r\n"
	// Reading its body past the first 1024 bytes buffers the next request whole.
	longPost := "POST http://a.test/one HTTP/1.1\r\nHost: a.test\r\nContent-Length: 2000\r\n\r\n" + strings.Repeat("b", 2000)
	tests := []struct {
		name   string
		max    int
		before string // the request pipelined in front, if any
		header int    // the size of the header of the request behind it
		want   []int
	}{
		{"alone, at the bound", 1024, "", 1024, []int{200}},
		{"alone, over the bound", 1024, "", 1025, []int{431}},
		{"behind a GET, at the bound", 1024, get, 1024, []int{200, 200}},
		{"behind a GET, over the bound", 1024, get, 1025, []int{200, 431}},
		{"behind a POST, at the bound", 1024, post, 1024, []int{200, 200}},
		{"behind a POST, over the bound", 1024, post, 1025, []int{200, 431}},
		{"behind a long POST, buffered whole, at the bound", 1024, longPost, 1024, []int{200, 200}},
		{"behind a long POST, buffered whole, over the bound", 1024, longPost, 2500, []int{200, 431}},
		{"behind a GET, default bound, over it", 0, get, 32<<10 + 1, []int{200, 431}},
		{"behind a GET, default bound, at it", 0, get, 32 << 10, []int{200, 200}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld()
			w.httpOrigin(t, "a.test")
			httpAddr, _ := w.serve(t, &Server{MaxHeaderBytes: tt.max})
			c, br := dialProxy(t, httpAddr)
			// One write: the second header reaches the proxy with the first request.
			if _, err := io.WriteString(c, tt.before+lastGet(t, tt.header)); err != nil {
				t.Fatal(err)
			}
			if got := statuses(t, br); !slices.Equal(got, tt.want) {
				t.Fatalf("answers %v, want %v", got, tt.want)
			}
		})
	}
}

// TestHTTPForwardContentLengthAndChunked: a request with both Content-Length and
// Transfer-Encoding may be a smuggling attempt (RFC 9112 §6.1): it is forwarded chunked
// without its Content-Length, and the client connection closes after the answer, so the
// request pipelined behind it is not forwarded. A request with one framing keeps the
// connection. (Before, the connection stayed open and the request behind was sent on.)
func TestHTTPForwardContentLengthAndChunked(t *testing.T) {
	const next = "GET http://s.test/next HTTP/1.1\r\nHost: s.test\r\nConnection: close\r\n\r\n"
	tests := []struct {
		name     string
		req      string // a POST of "abc" to s.test/first, with next pipelined behind it
		want     []int
		wantSeen []string // what the origin was sent: path, framing, body of each request
	}{
		{"Content-Length, then Transfer-Encoding",
			"POST http://s.test/first HTTP/1.1\r\nHost: s.test\r\nContent-Length: 8\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
			[]int{200}, []string{"/first chunked abc"}},
		{"Transfer-Encoding, then content-length in lower case",
			"POST http://s.test/first HTTP/1.1\r\nHost: s.test\r\nTransfer-Encoding: chunked\r\ncontent-length: 40\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
			[]int{200}, []string{"/first chunked abc"}},
		{"Content-Length: 0 and Transfer-Encoding",
			"POST http://s.test/first HTTP/1.1\r\nHost: s.test\r\nCONTENT-LENGTH: 0\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
			[]int{200}, []string{"/first chunked abc"}},
		{"Transfer-Encoding only",
			"POST http://s.test/first HTTP/1.1\r\nHost: s.test\r\nTransfer-Encoding: chunked\r\nX-Content-Length: 8\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
			[]int{200, 200}, []string{"/first chunked abc", "/next none "}},
		{"Content-Length only",
			"POST http://s.test/first HTTP/1.1\r\nHost: s.test\r\nContent-Length: 3\r\n\r\nabc",
			[]int{200, 200}, []string{"/first length 3 abc", "/next none "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld()
			var mu sync.Mutex
			var seenBy []string
			w.origin(t, "s.test", func(c net.Conn) {
				// Read as sent: net/http would hide a Content-Length next to chunked.
				br := bufio.NewReader(c)
				tp := textproto.NewReader(br)
				for range 5 {
					line, err := tp.ReadLine()
					if err != nil {
						return
					}
					h, err := tp.ReadMIMEHeader()
					if err != nil {
						return
					}
					var framing string
					var body []byte
					switch cl := h.Values("Content-Length"); {
					case h.Get("Transfer-Encoding") == "chunked" && cl == nil:
						framing = "chunked"
						if body, err = io.ReadAll(httputil.NewChunkedReader(br)); err == nil {
							_, err = tp.ReadMIMEHeader() // the trailer section
						}
					case cl == nil && h.Get("Transfer-Encoding") == "":
						framing = "none"
					case len(cl) == 1 && h.Get("Transfer-Encoding") == "":
						framing = "length " + cl[0]
						n, _ := strconv.Atoi(cl[0])
						body = make([]byte, n)
						_, err = io.ReadFull(br, body)
					default:
						framing = fmt.Sprintf("Content-Length %q, Transfer-Encoding %q", cl, h.Values("Transfer-Encoding"))
					}
					mu.Lock()
					seenBy = append(seenBy, strings.Fields(line)[1]+" "+framing+" "+string(body))
					mu.Unlock()
					if err != nil {
						return
					}
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			})
			httpAddr, _ := w.serve(t, nil)
			c, br := dialProxy(t, httpAddr)
			if _, err := io.WriteString(c, tt.req+next); err != nil {
				t.Fatal(err)
			}
			if got := statuses(t, br); !slices.Equal(got, tt.want) {
				t.Errorf("answers %v, want %v", got, tt.want)
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(seenBy, tt.wantSeen) {
				t.Errorf("the origin was sent %q, want %q", seenBy, tt.wantSeen)
			}
			const warning = "both Content-Length and Transfer-Encoding"
			if logged := strings.Contains(w.logs.String(), warning); logged != (len(tt.want) == 1) {
				t.Errorf("log has %q: %v, want %v", warning, logged, !logged)
			}
		})
	}
}

func TestHeaderHasField(t *testing.T) {
	tests := []struct {
		name string
		head string
		want bool
	}{
		{"field", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n", true},
		{"lower case, bare LF", "POST / HTTP/1.1\ncontent-length:3\n\n", true},
		{"absent", "POST / HTTP/1.1\r\nHost: h\r\n\r\n", false},
		{"longer name", "POST / HTTP/1.1\r\nContent-Length-X: 3\r\n\r\n", false},
		{"in a value", "POST / HTTP/1.1\r\nX: Content-Length: 3\r\n\r\n", false},
		{"in a folded line", "POST / HTTP/1.1\r\nX: a\r\n Content-Length: 3\r\n\r\n", false},
		{"in the request line", "Content-Length: 3\r\nHost: h\r\n\r\n", false},
		{"empty", "", false},
	}
	for _, tt := range tests {
		if got := headerHasField([]byte(tt.head), "Content-Length"); got != tt.want {
			t.Errorf("%s: headerHasField(%q, Content-Length) = %v, want %v", tt.name, tt.head, got, tt.want)
		}
	}
}
