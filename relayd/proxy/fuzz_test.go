package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var httpSeeds = []string{
	"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
	"CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n",
	"GET http://example.com/a?b=c HTTP/1.1\r\nHost: example.com\r\nProxy-Connection: keep-alive\r\n\r\n",
	"POST http://192.0.2.1:8080/ HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
	"PUT http://h/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: origin-form\r\n\r\n",
	"GET https://x/ HTTP/1.1\r\n\r\n",
	"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
	"CONNECT h HTTP/1.1\r\n\r\n",
	"GET http://u:p@h/ HTTP/1.0\r\n\r\n",
	"CONNECT [a.test:1]:443 HTTP/1.1\r\n\r\n",
	"GET http://a.test../ HTTP/1.1\r\n\r\n",
	"POST http://h/ HTTP/1.1\r\nContent-Length: 8\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET http://h/x HTTP/1.1\r\n\r\n",
	"POST http://h/ HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET http://h/ HTTP/1.1\r\nX: " + strings.Repeat("x", 1100) + "\r\n\r\n",
}

// FuzzReadProxyRequest: any input, read as requests pipelined on one connection, yields
// requests with a usable target or an error, never a panic, and the header bound holds
// for each of them, whatever was buffered behind the one before.
func FuzzReadProxyRequest(f *testing.F) {
	for _, s := range httpSeeds {
		f.Add([]byte(s))
	}
	const bound = 1024
	f.Fuzz(func(t *testing.T, b []byte) {
		src := bytes.NewReader(b)
		cr := &clientReader{r: src}
		br := bufio.NewReaderSize(cr, 4096)
		taken := func() int { return len(b) - src.Len() - br.Buffered() }
		for i := range 4 {
			start := taken()
			req, target, err := readProxyRequest(br, cr, bound, slog.New(slog.DiscardHandler))
			if err != nil {
				return
			}
			if req == nil || !target.Valid() {
				t.Fatalf("readProxyRequest(%q) = %v, %+v without error", b, req, target)
			}
			if n := taken() - start; n > bound {
				t.Fatalf("request %d of %q: read a %d-byte header with a bound of %d", i, b, n, bound)
			}
			if target.Host != "" {
				if h, err := domainTarget(target.Host); err != nil || h != target.Host {
					t.Fatalf("target host %q is not normalized (%v)", target.Host, err)
				}
			}
			if req.Method == "CONNECT" {
				return
			}
			if _, err := io.Copy(io.Discard, req.Body); err != nil {
				return
			}
		}
	})
}

var socksSeeds = [][]byte{
	{5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1, 0, 80},
	append(append([]byte{5, 2, 0, 2, 5, 1, 0, 3, 11}, "example.com"...), 1, 187),
	append([]byte{5, 1, 0, 5, 1, 0, 4}, append(bytes.Repeat([]byte{0x20, 0x01}, 8), 0, 22)...),
	{5, 1, 0, 5, 2, 0, 1, 0, 0, 0, 0, 0, 0},
	{5, 1, 0, 5, 1, 0, 9},
	{5, 1, 2},
	{4, 1, 0, 80, 1, 2, 3, 4, 0},
	{5, 1, 0, 5, 1, 0, 3, 0, 0, 80},
	append(append([]byte{5, 1, 0, 5, 1, 0, 3, 8}, "a.test:1"...), 1, 187),
	append(append([]byte{5, 1, 0, 5, 1, 0, 3, 3}, "::1"...), 1, 187),
}

// FuzzSOCKS5Handshake: any input yields a valid CONNECT target or a refusal.
func FuzzSOCKS5Handshake(f *testing.F) {
	for _, s := range socksSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var out bytes.Buffer
		target, err := readSOCKSRequest(bytes.NewReader(b), &out)
		if out.Len() > 2 {
			t.Fatalf("wrote %d bytes during the greeting", out.Len())
		}
		if err != nil {
			return
		}
		if !target.Valid() || target.Port == 0 {
			t.Fatalf("readSOCKSRequest(% x) = %+v without error", b, target)
		}
		if out.String() != "\x05\x00" {
			t.Fatalf("accepted a request without selecting no-auth: % x", out.Bytes())
		}
	})
}

// TestWriteSeedCorpus writes the seeds above to testdata/fuzz (KL_UPDATE_GOLDEN=1).
// TestWriteSeedCorpus checks that the committed seed corpus holds the seeds above
// (KL_UPDATE_GOLDEN=1 writes them).
func TestWriteSeedCorpus(t *testing.T) {
	update := os.Getenv("KL_UPDATE_GOLDEN") == "1"
	write := func(fuzz string, i int, b []byte) {
		dir := filepath.Join("testdata", "fuzz", fuzz)
		path := filepath.Join(dir, fmt.Sprintf("seed-%d", i))
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if !update {
			if got, err := os.ReadFile(path); err != nil || string(got) != body {
				t.Errorf("%s: %v; not the seed %q (KL_UPDATE_GOLDEN=1 writes the corpus)", path, err, b)
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
	for i, s := range httpSeeds {
		write("FuzzReadProxyRequest", i, []byte(s))
	}
	for i, s := range socksSeeds {
		write("FuzzSOCKS5Handshake", i, s)
	}
}

func TestAuthorityTarget(t *testing.T) {
	tests := []struct {
		in      string
		def     uint16
		want    string
		wantErr bool
	}{
		{"example.com:443", 0, "example.com:443", false},
		{"EXAMPLE.com.:8443", 0, "example.com:8443", false},
		{"[2001:db8::1]:443", 0, "[2001:db8::1]:443", false},
		{"[::ffff:192.0.2.1]:80", 0, "192.0.2.1:80", false},
		{"192.0.2.1:80", 0, "192.0.2.1:80", false},
		{"example.com", 80, "example.com:80", false},
		{"[2001:db8::1]", 80, "[2001:db8::1]:80", false},
		{"example.com", 0, "", true},
		{"example.com:0", 0, "", true},
		{"example.com:99999", 0, "", true},
		{"[fe80::1%eth0]:443", 0, "", true},
		{"exa mple.com:443", 0, "", true},
		{":443", 0, "", true},
		{"[example.com:1]:443", 0, "", true},
		{"[example.com:1]", 80, "", true},
		{"example.com..:443", 0, "", true},
		{"[::1]:443", 0, "[::1]:443", false},
	}
	for _, tt := range tests {
		got, err := authorityTarget(tt.in, tt.def)
		if (err != nil) != tt.wantErr || (err == nil && got.String() != tt.want) {
			t.Errorf("authorityTarget(%q, %d) = %v, %v; want %q (error %v)", tt.in, tt.def, got, err, tt.want, tt.wantErr)
		}
	}
}
