package sniff

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// recordConn captures what a TLS client writes and then fails its reads, so a client
// handshake stops right after sending the ClientHello.
type recordConn struct {
	net.Conn
	buf bytes.Buffer
}

func (c *recordConn) Write(p []byte) (int, error) { return c.buf.Write(p) }
func (c *recordConn) Read(p []byte) (int, error)  { return 0, errors.New("recorded") }
func (c *recordConn) Close() error                { return nil }
func (c *recordConn) SetDeadline(time.Time) error { return nil }
func (c *recordConn) SetWriteDeadline(time.Time) error {
	return nil
}

// clientHello returns the bytes a crypto/tls client sends first with this config.
func clientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	rc := &recordConn{}
	_ = tls.Client(rc, cfg).Handshake()
	if rc.buf.Len() == 0 {
		t.Fatal("the TLS client wrote nothing")
	}
	return rc.buf.Bytes()
}

// resplit moves the handshake message of a single-record hello into records of at most
// size bytes each (valid TLS: handshake messages may be fragmented across records).
func resplit(t testing.TB, hello []byte, size int) []byte {
	t.Helper()
	n := int(hello[3])<<8 | int(hello[4])
	if len(hello) != 5+n {
		t.Fatalf("hello is not one record: %d bytes, record of %d", len(hello), n)
	}
	msg := hello[5:]
	var out []byte
	for len(msg) > 0 {
		k := min(size, len(msg))
		out = append(out, 0x16, 0x03, 0x01, byte(k>>8), byte(k))
		out = append(out, msg[:k]...)
		msg = msg[k:]
	}
	return out
}

func helloCases(t testing.TB) []struct {
	name  string
	hello []byte
	want  string
} {
	big := &tls.Config{ServerName: "big.example.org", InsecureSkipVerify: true,
		CurvePreferences: []tls.CurveID{tls.X25519MLKEM768, tls.X25519, tls.CurveP256, tls.CurveP384, tls.CurveP521},
		NextProtos:       []string{"h2", "http/1.1", strings.Repeat("p", 200), strings.Repeat("q", 200)}}
	bigHello := clientHello(t, big)
	return []struct {
		name  string
		hello []byte
		want  string
	}{
		{"sni", clientHello(t, &tls.Config{ServerName: "www.example.com"}), "www.example.com"},
		{"sni mixed case", clientHello(t, &tls.Config{ServerName: "API.Example.COM", InsecureSkipVerify: true}), "api.example.com"},
		{"no sni", clientHello(t, &tls.Config{InsecureSkipVerify: true}), ""},
		{"ipv4 literal sends no sni", clientHello(t, &tls.Config{ServerName: "192.0.2.1"}), ""},
		{"ipv6 literal sends no sni", clientHello(t, &tls.Config{ServerName: "2001:db8::1"}), ""},
		{"tls12 only", clientHello(t, &tls.Config{ServerName: "old.example.net", MaxVersion: tls.VersionTLS12}), "old.example.net"},
		{"big key share and alpn", bigHello, "big.example.org"},
		{"split into 100-byte records", resplit(t, bigHello, 100), "big.example.org"},
		{"split into 1-byte records", resplit(t, clientHello(t, &tls.Config{ServerName: "tiny.example"}), 1), "tiny.example"},
	}
}

func TestServerName(t *testing.T) {
	for _, tt := range helloCases(t) {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ServerName(tt.hello)
			if err != nil || got != tt.want {
				t.Fatalf("ServerName(%d bytes) = %q, %v; want %q", len(tt.hello), got, err, tt.want)
			}
			if got, err := Parse(tt.hello); err != nil || got != tt.want {
				t.Fatalf("Parse = %q, %v; want %q", got, err, tt.want)
			}
			// Every proper prefix is incomplete, never a wrong answer.
			for i := range len(tt.hello) {
				if h, err := ServerName(tt.hello[:i]); !errors.Is(err, ErrIncomplete) {
					t.Fatalf("ServerName(prefix %d of %d) = %q, %v; want ErrIncomplete", i, len(tt.hello), h, err)
				}
			}
			// Bytes after the hello (early data, a second record) change nothing.
			if got, err := ServerName(append(bytes.Clone(tt.hello), 0x17, 0x03, 0x03, 0, 1, 0)); err != nil || got != tt.want {
				t.Fatalf("ServerName(hello + more) = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
	if len(helloCases(t)[6].hello) < 1500 {
		t.Fatalf("the big hello is only %d bytes; it should exercise a large key share", len(helloCases(t)[6].hello))
	}
}

func TestServerNameRejects(t *testing.T) {
	hello := clientHello(t, &tls.Config{ServerName: "x.example"})
	corrupt := bytes.Clone(hello)
	corrupt[5+4+2+32] = 0xff // session id length way past the end
	tests := []struct {
		name string
		b    []byte
		want error
	}{
		{"http", []byte("GET / HTTP/1.1\r\n"), ErrNotTLS},
		{"alert record", []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28}, ErrNotTLS},
		{"ssl2-ish", []byte{0x16, 0x02, 0x00}, ErrNotTLS},
		{"server hello", []byte{0x16, 0x03, 0x03, 0x00, 0x04, 0x02, 0x00, 0x00, 0x00}, ErrNotTLS},
		{"zero-length record", []byte{0x16, 0x03, 0x01, 0x00, 0x00}, ErrMalformed},
		{"huge record", []byte{0x16, 0x03, 0x01, 0xff, 0xff}, ErrMalformed},
		{"truncated body", corrupt, ErrMalformed},
		{"empty", nil, ErrIncomplete},
	}
	for _, tt := range tests {
		if h, err := ServerName(tt.b); !errors.Is(err, tt.want) {
			t.Errorf("%s: ServerName = %q, %v; want %v", tt.name, h, err, tt.want)
		}
	}
}

// rawHello builds a TLS 1.3-style ClientHello record with these extensions (each a type
// and its data), for shapes crypto/tls never sends.
func rawHello(exts ...[]byte) []byte {
	var e []byte
	for i := 0; i+1 < len(exts); i += 2 {
		typ, data := exts[i], exts[i+1]
		e = append(e, typ...)
		e = append(e, byte(len(data)>>8), byte(len(data)))
		e = append(e, data...)
	}
	body := []byte{0x03, 0x03}
	body = append(body, make([]byte, 32)...)           // random
	body = append(body, 0, 0, 2, 0x13, 0x01, 1, 0)     // no session id, one suite, null compression
	body = append(body, byte(len(e)>>8), byte(len(e))) // extensions
	body = append(body, e...)
	msg := append([]byte{0x01, 0, byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{0x16, 0x03, 0x01, byte(len(msg) >> 8), byte(len(msg))}, msg...)
}

// serverNames is a server_name extension's data listing these host_names.
func serverNames(names ...string) []byte {
	var list []byte
	for _, n := range names {
		list = append(list, 0, byte(len(n)>>8), byte(len(n)))
		list = append(list, n...)
	}
	return append([]byte{byte(len(list) >> 8), byte(len(list))}, list...)
}

// An ambiguous SNI is refused: a server reads one name, and which one is not for the
// relay to guess.
func TestServerNameAmbiguous(t *testing.T) {
	sni := []byte{0, 0}
	other := []byte{0, 0x2b} // supported_versions
	tests := []struct {
		name string
		b    []byte
		want string
		err  error
	}{
		{"one name", rawHello(sni, serverNames("a.example"), other, []byte{2, 3, 4}), "a.example", nil},
		{"two host_names", rawHello(sni, serverNames("a.example", "b.example")), "", ErrMalformed},
		{"the same name twice", rawHello(sni, serverNames("a.example", "a.example")), "", ErrMalformed},
		{"two server_name extensions", rawHello(sni, serverNames("a.example"), sni, serverNames("b.example")), "", ErrMalformed},
		{"no host_name in the list", rawHello(sni, []byte{0, 0}), "", ErrMalformed},
		{"no server_name", rawHello(other, []byte{2, 3, 4}), "", nil},
	}
	for _, tt := range tests {
		h, err := ServerName(tt.b)
		if h != tt.want || !errors.Is(err, tt.err) || (tt.err == nil && err != nil) {
			t.Errorf("%s: ServerName = %q, %v; want %q, %v", tt.name, h, err, tt.want, tt.err)
		}
	}
}

// withServerName returns a crypto/tls ClientHello whose SNI holds name, which a real
// client would refuse to send (the bytes of a placeholder of the same length are replaced).
func withServerName(t testing.TB, name string) []byte {
	t.Helper()
	placeholder := strings.Repeat("z", len(name))
	hello := clientHello(t, &tls.Config{ServerName: placeholder, InsecureSkipVerify: true})
	i := bytes.Index(hello, []byte(placeholder))
	if i < 0 || bytes.Count(hello, []byte(placeholder)) != 1 {
		t.Fatalf("cannot find the placeholder server name in the hello")
	}
	copy(hello[i:], name)
	return hello
}

// A colon belongs only in an IPv6 literal and brackets only around one: a name like
// "evil.example:443" or "a:b" is not a DNS name and must not reach domain rules or an exit.
func TestNotDNSNames(t *testing.T) {
	for _, name := range []string{"evil.example:443", "a:b", "x:y.allowed.example", ":::::"} {
		if h, err := ServerName(withServerName(t, name)); h != "" || !errors.Is(err, ErrMalformed) {
			t.Errorf("ServerName(SNI %q) = %q, %v; want ErrMalformed", name, h, err)
		}
	}
	for _, host := range []string{"a:b:c", "evil.example:80:80", "[evil.example]", "[evil.example]:80", "[1.2.3.4]:80", "[::1", "::1]:80", "[::1]x", "[::1]]:80"} {
		req := "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n"
		if h, err := HTTPHost([]byte(req)); h != "" || !errors.Is(err, ErrMalformed) {
			t.Errorf("HTTPHost(Host: %s) = %q, %v; want ErrMalformed", host, h, err)
		}
	}
	// IP literals still come through (the rule engine reads them as addresses), whatever
	// text stands for the port: a server reads the host and leaves the port alone.
	for host, want := range map[string]string{"[2001:DB8::1]:80": "2001:db8::1", "2001:db8::2": "2001:db8::2", "::ffff:192.0.2.1": "::ffff:192.0.2.1", "[::1]:8o": "::1", "[::1]:": "::1"} {
		req := "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n"
		if h, err := HTTPHost([]byte(req)); h != want || err != nil {
			t.Errorf("HTTPHost(Host: %s) = %q, %v; want %q", host, h, err, want)
		}
	}
}

func TestHTTPHost(t *testing.T) {
	tests := []struct {
		name string
		req  string
		want string
		err  error
	}{
		{"simple", "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n", "example.com", nil},
		{"port and case", "POST /x HTTP/1.1\r\nUser-Agent: a\r\nhOsT:  WWW.Example.Com:8080 \r\n\r\n", "www.example.com", nil},
		{"ipv6 literal", "GET / HTTP/1.1\r\nHost: [2001:db8::1]:8080\r\n\r\n", "2001:db8::1", nil},
		{"ipv6 no port", "GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n", "::1", nil},
		{"ipv4", "GET / HTTP/1.1\r\nHost: 192.0.2.7:80\r\n\r\n", "192.0.2.7", nil},
		{"trailing dot", "GET / HTTP/1.1\r\nHost: example.com.\r\n\r\n", "example.com", nil},
		{"bare LF", "GET / HTTP/1.0\nHost: lf.example\n\n", "lf.example", nil},
		{"host before end of headers", "GET / HTTP/1.1\r\nHost: early.example\r\nAccept: x", "early.example", nil},
		{"no host http/1.0", "GET / HTTP/1.0\r\nAccept: */*\r\n\r\n", "", nil},
		{"absolute-form target names the host, not Host", "GET http://other.example/ HTTP/1.1\r\nHost: hdr.example\r\n\r\n", "other.example", nil},
		{"absolute-form with userinfo and port", "GET HTTP://allowed.example:80@Evil.Example:8080/p?q@x HTTP/1.1\r\nHost: allowed.example\r\n\r\n", "evil.example", nil},
		{"absolute-form ipv6", "GET http://[2001:db8::9]:80 HTTP/1.1\r\nHost: hdr.example\r\n\r\n", "2001:db8::9", nil},
		{"absolute-form http/1.0 without host", "GET http://old.example/x HTTP/1.0\r\n\r\n", "old.example", nil},
		{"absolute-form before the headers end", "GET http://early.example/ HTTP/1.1\r\nAcc", "early.example", nil},
		{"absolute-form bad host", "GET http://a b/ HTTP/1.1\r\n\r\n", "", ErrMalformed},
		{"absolute-form empty host", "GET http:///x HTTP/1.1\r\nHost: hdr.example\r\n\r\n", "", ErrMalformed},
		{"connect target names the host", "CONNECT tunnel.example:443 HTTP/1.1\r\nHost: hdr.example\r\n\r\n", "tunnel.example", nil},
		{"path holding a url stays origin-form", "GET /?u=http://other.example/ HTTP/1.1\r\nHost: hdr.example\r\n\r\n", "hdr.example", nil},
		// The port is not the rules' business: servers take the host before the last
		// colon (RFC 3986 allows an empty port; Go's ServeMux serves any port text).
		{"empty port", "GET / HTTP/1.1\r\nHost: blocked.example:\r\n\r\n", "blocked.example", nil},
		{"port not a number", "GET / HTTP/1.1\r\nHost: blocked.example:x\r\n\r\n", "blocked.example", nil},
		{"port out of range", "GET / HTTP/1.1\r\nHost: blocked.example:123456\r\n\r\n", "blocked.example", nil},
		{"absolute-form empty port", "GET http://blocked.example:/ HTTP/1.1\r\nHost: hdr.example\r\n\r\n", "blocked.example", nil},
		{"connect empty port", "CONNECT blocked.example: HTTP/1.1\r\n\r\n", "blocked.example", nil},
		{"empty host is no name", "GET / HTTP/1.1\r\nHost: \r\n\r\n", "", nil},
		{"empty host with a port is no name", "GET / HTTP/1.1\r\nHost: :80\r\n\r\n", "", nil},
		// Request lines servers accept (RFC 9112 §2.2, §3; Python's http.server, nginx).
		{"empty line before the request", "\r\nGET / HTTP/1.1\r\nHost: lead.example\r\n\r\n", "lead.example", nil},
		{"empty lines before the request", "\n\r\n\r\nGET / HTTP/1.1\r\nHost: lead.example\r\n\r\n", "lead.example", nil},
		{"space after the version", "GET / HTTP/1.1 \r\nHost: trail.example\r\n\r\n", "trail.example", nil},
		{"tabs and runs of spaces", "GET\t/  HTTP/1.1\t \r\nHost: ws.example\r\n\r\n", "ws.example", nil},
		{"two-digit minor version", "GET / HTTP/1.10\r\nHost: minor.example\r\n\r\n", "minor.example", nil},
		{"leading zeros in the version", "GET / HTTP/01.01\r\nHost: zero.example\r\n\r\n", "zero.example", nil},
		{"http/0.9 spelled out", "GET / HTTP/0.9\r\nHost: old.example\r\n\r\n", "old.example", nil},
		{"only empty lines yet", "\r\n\r\n", "", ErrIncomplete},
		{"empty line, then half a cr", "\r\n\r", "", ErrIncomplete},
		{"host line not known to end yet", "GET / HTTP/1.1\r\nHost: a.example\r\n", "", ErrIncomplete},
		{"http/2 version", "GET / HTTP/2.0\r\nHost: h2.example\r\n\r\n", "", ErrNotHTTP},
		{"version without a minor", "GET / HTTP/1\r\nHost: a.example\r\n\r\n", "", ErrNotHTTP},
		{"no target", "GET HTTP/1.1\r\nHost: a.example\r\n\r\n", "", ErrNotHTTP},
		{"lowercase version", "GET / http/1.1\r\nHost: a.example\r\n\r\n", "", ErrNotHTTP},
		// A name present but not readable as one is malformed, never no name.
		{"whitespace before the colon of host", "GET / HTTP/1.1\r\nHost : blocked.example\r\n\r\n", "", ErrMalformed},
		{"tab before the colon of host", "GET / HTTP/1.1\r\nhost\t: blocked.example\r\n\r\n", "", ErrMalformed},
		{"host folded over lines", "GET / HTTP/1.1\r\nHost: ok.example\r\n blocked.example\r\n\r\n", "", ErrMalformed},
		{"folded host not known to end yet", "GET / HTTP/1.1\r\nHost: ok.example\r\n ", "", ErrIncomplete},
		{"absolute-form colon only", "GET http://:/ HTTP/1.1\r\nHost: hdr.example\r\n\r\n", "", ErrMalformed},
		{"incomplete line", "GET /index.html HTT", "", ErrIncomplete},
		{"incomplete headers", "GET / HTTP/1.1\r\nAccept: */*\r\n", "", ErrIncomplete},
		{"method only", "OPTIONS", "", ErrIncomplete},
		{"ssh", "SSH-2.0-OpenSSH_9.6\r\n", "", ErrNotHTTP},
		{"smtp-ish binary", "\x00\x01\x02", "", ErrNotHTTP},
		{"http2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "", ErrNotHTTP},
		{"long method", strings.Repeat("A", 40) + " / HTTP/1.1\r\n", "", ErrNotHTTP},
		{"control in target", "GET /\x01", "", ErrNotHTTP},
		{"bad host", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", "", ErrMalformed},
		{"header without colon", "GET / HTTP/1.1\r\nbogus\r\n\r\n", "", ErrMalformed},
		{"two host headers", "GET / HTTP/1.1\r\nHost: a.example\r\nAccept: */*\r\nhost: b.example\r\n\r\n", "", ErrMalformed},
		{"the same host twice", "GET / HTTP/1.1\r\nHost: a.example\r\nHost: a.example\r\n\r\n", "", ErrMalformed},
		{"a second host not received yet is not waited for", "GET / HTTP/1.1\r\nHost: a.example\r\nAccept: */*\r\nHo", "a.example", nil},
		{"a line without a colon after host ends the look", "GET / HTTP/1.1\r\nHost: a.example\r\nfolded\r\nHost: b.example\r\n\r\n", "a.example", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := HTTPHost([]byte(tt.req))
			if got != tt.want || !errors.Is(err, tt.err) || (tt.err == nil && err != nil) {
				t.Fatalf("HTTPHost(%q) = %q, %v; want %q, %v", tt.req, got, err, tt.want, tt.err)
			}
			if tt.want == "" {
				return
			}
			// A request that names a host is incomplete until the name is known, never
			// something else: a client that sends it in pieces gets the same answer.
			for i := range len(tt.req) {
				if h, err := HTTPHost([]byte(tt.req[:i])); !errors.Is(err, ErrIncomplete) && (h != tt.want || err != nil) {
					t.Fatalf("HTTPHost(%q), a prefix of %q, = %q, %v; want ErrIncomplete or %q", tt.req[:i], tt.req, h, err, tt.want)
				}
			}
		})
	}
}

func TestParseAllocs(t *testing.T) {
	hello := clientHello(t, &tls.Config{ServerName: "www.example.com"})
	req := []byte("GET / HTTP/1.1\r\nHost: www.example.com\r\n\r\n")
	for name, b := range map[string][]byte{"tls": hello, "http": req} {
		// The host string itself is the one allocation.
		if n := testing.AllocsPerRun(200, func() { _, _ = Parse(b) }); n > 1 {
			t.Errorf("Parse(%s) allocates %v times, want at most 1", name, n)
		}
	}
}

func FuzzServerName(f *testing.F) {
	f.Add(clientHello(f, &tls.Config{ServerName: "fuzz.example"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ServerName(b)
		checkResult(t, b, h, err)
	})
}

func FuzzHTTPHost(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: fuzz.example:80\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := HTTPHost(b)
		checkResult(t, b, h, err)
		ph, perr := Parse(b)
		if len(b) > 0 && b[0] != 0x16 && (ph != h || !errors.Is(perr, errors.Unwrap(err)) && perr != err) {
			t.Fatalf("Parse(%q) = %q, %v but HTTPHost = %q, %v", b, ph, perr, h, err)
		}
	})
}

func checkResult(t *testing.T, b []byte, h string, err error) {
	t.Helper()
	if err != nil && h != "" {
		t.Fatalf("(%q) returned both %q and %v", b, h, err)
	}
	if h != "" && normalize(h) != h {
		t.Fatalf("(%q) returned a non-normalized name %q", b, h)
	}
	if strings.ContainsAny(h, ":[]") && !isIPv6(h) {
		t.Fatalf("(%q) returned %q, neither a DNS name nor an IPv6 literal", b, h)
	}
}

// TestWriteSeedCorpus regenerates testdata/fuzz from real clients (KL_UPDATE_GOLDEN=1).
// TestWriteSeedCorpus checks that the committed seed corpus holds the seeds below
// (KL_UPDATE_GOLDEN=1 writes them). ClientHellos are random from run to run: the
// committed ones must be there and be ClientHellos (ServerName reads them).
func TestWriteSeedCorpus(t *testing.T) {
	update := os.Getenv("KL_UPDATE_GOLDEN") == "1"
	write := func(fuzz, name string, b []byte) {
		dir := filepath.Join("testdata", "fuzz", fuzz)
		path := filepath.Join(dir, name)
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if !update {
			got, err := os.ReadFile(path)
			switch {
			case err != nil:
				t.Errorf("%s: %v (KL_UPDATE_GOLDEN=1 writes the corpus)", path, err)
			case fuzz == "FuzzServerName":
				quoted, ok := strings.CutPrefix(strings.TrimSpace(string(got)), "go test fuzz v1\n[]byte(")
				hello, qerr := strconv.Unquote(strings.TrimSuffix(quoted, ")"))
				if _, serr := ServerName([]byte(hello)); !ok || qerr != nil || serr != nil {
					t.Errorf("%s: not a ClientHello seed (%v, %v)", path, qerr, serr)
				}
			case string(got) != body:
				t.Errorf("%s: not the seed %q (KL_UPDATE_GOLDEN=1 writes the corpus)", path, b)
			}
			return
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range helloCases(t) {
		write("FuzzServerName", fmt.Sprintf("hello-%d", i), c.hello)
	}
	for i, r := range []string{
		"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"CONNECT x:443 HTTP/1.1\r\nHost: [2001:db8::1]:443\r\nProxy-Authorization: Basic eA==\r\n\r\n",
		"GET / HTTP/1.0\nAccept: */*\n\n",
		"POST /a HTTP/1.1\r\nhost: UPPER.Example.:8080\r\nContent-Length: 1\r\n\r\nx",
		"SSH-2.0-OpenSSH_9.6\r\n",
	} {
		write("FuzzHTTPHost", fmt.Sprintf("req-%d", i), []byte(r))
	}
}
