package sniff

import "fmt"

const (
	recordHandshake    = 0x16
	handshakeHello     = 0x01
	extServerName      = 0x0000
	nameTypeHostName   = 0x00
	maxRecordPlaintext = 1<<14 + 2048 // TLSCiphertext bound; a hello record is plaintext
)

// ServerName returns the SNI host_name of the TLS ClientHello at the start of b,
// lowercased. The hello may span several TLS records; ErrIncomplete means b ends before
// the hello does.
func ServerName(b []byte) (string, error) {
	hs, err := handshakeMessage(b)
	if err != nil {
		return "", err
	}
	return helloServerName(hs)
}

// handshakeMessage returns the first handshake message, reassembled from as many
// records as it spans. The common single-record case does not copy.
func handshakeMessage(b []byte) ([]byte, error) {
	var joined []byte
	var need = -1 // total handshake bytes (header + body) once known
	first := true
	for {
		if len(b) < 1 {
			return nil, ErrIncomplete
		}
		if b[0] != recordHandshake {
			if first {
				return nil, ErrNotTLS
			}
			return nil, fmt.Errorf("%w: record of type %d inside the ClientHello", ErrMalformed, b[0])
		}
		if len(b) >= 2 && b[1] != 0x03 {
			if first {
				return nil, ErrNotTLS
			}
			return nil, fmt.Errorf("%w: record major version %d", ErrMalformed, b[1])
		}
		if len(b) < 5 {
			return nil, ErrIncomplete
		}
		n := int(b[3])<<8 | int(b[4])
		if n == 0 || n > maxRecordPlaintext {
			return nil, fmt.Errorf("%w: record length %d", ErrMalformed, n)
		}
		frag := b[5:]
		complete := len(frag) >= n
		if complete {
			frag = frag[:n]
		}
		if first && complete && len(frag) >= 4 {
			// Fast path: the whole message in the first record.
			if frag[0] != handshakeHello {
				return nil, ErrNotTLS
			}
			if m := 4 + (int(frag[1])<<16 | int(frag[2])<<8 | int(frag[3])); m <= len(frag) {
				return frag[:m], nil
			}
		}
		if first && len(frag) >= 1 && frag[0] != handshakeHello {
			return nil, ErrNotTLS
		}
		joined = append(joined, frag...)
		if need < 0 && len(joined) >= 4 {
			need = 4 + (int(joined[1])<<16 | int(joined[2])<<8 | int(joined[3]))
			if need > MaxPeek*4 {
				return nil, fmt.Errorf("%w: ClientHello of %d bytes", ErrMalformed, need)
			}
		}
		if need >= 0 && len(joined) >= need {
			return joined[:need], nil
		}
		if !complete {
			return nil, ErrIncomplete
		}
		b = b[5+n:]
		first = false
	}
}

// reader is a bounds-checked cursor over a handshake message.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) skip(n int) {
	if r.bad || n > len(r.b) {
		r.bad = true
		return
	}
	r.b = r.b[n:]
}

func (r *reader) u8() int {
	if r.bad || len(r.b) < 1 {
		r.bad = true
		return 0
	}
	v := int(r.b[0])
	r.b = r.b[1:]
	return v
}

func (r *reader) u16() int {
	if r.bad || len(r.b) < 2 {
		r.bad = true
		return 0
	}
	v := int(r.b[0])<<8 | int(r.b[1])
	r.b = r.b[2:]
	return v
}

func (r *reader) bytes(n int) []byte {
	if r.bad || n > len(r.b) {
		r.bad = true
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// helloServerName parses a complete ClientHello handshake message (RFC 8446 §4.1.2,
// RFC 6066 §3).
func helloServerName(hs []byte) (string, error) {
	r := reader{b: hs}
	if r.u8() != handshakeHello {
		return "", ErrNotTLS
	}
	r.skip(3)       // length, already checked by the caller
	r.skip(2 + 32)  // legacy_version, random
	r.skip(r.u8())  // legacy_session_id
	r.skip(r.u16()) // cipher_suites
	r.skip(r.u8())  // legacy_compression_methods
	if r.bad {
		return "", fmt.Errorf("%w: truncated ClientHello", ErrMalformed)
	}
	if len(r.b) == 0 {
		return "", nil // no extensions at all (TLS 1.0-era hello)
	}
	ext := reader{b: r.bytes(r.u16())}
	if r.bad {
		return "", fmt.Errorf("%w: extensions overrun the ClientHello", ErrMalformed)
	}
	// Every extension is read: a second server_name extension, or a second host_name in
	// one, makes the name ambiguous (RFC 8446 §4.2, RFC 6066 §3: a server refuses such a
	// hello), and one the policy read could be another than the server reads.
	host, seen := "", false
	for len(ext.b) > 0 {
		typ := ext.u16()
		data := ext.bytes(ext.u16())
		if ext.bad {
			return "", fmt.Errorf("%w: truncated extension", ErrMalformed)
		}
		if typ != extServerName {
			continue
		}
		if seen {
			return "", fmt.Errorf("%w: two server_name extensions", ErrMalformed)
		}
		seen = true
		sn := reader{b: data}
		list := reader{b: sn.bytes(sn.u16())}
		for !sn.bad && len(list.b) > 0 {
			nt := list.u8()
			name := list.bytes(list.u16())
			if list.bad {
				break
			}
			if nt != nameTypeHostName {
				continue
			}
			if host != "" {
				return "", fmt.Errorf("%w: more than one host_name in server_name", ErrMalformed)
			}
			if host = normalize(string(name)); host == "" {
				return "", fmt.Errorf("%w: server name is not a DNS name", ErrMalformed)
			}
		}
		if sn.bad || list.bad || host == "" {
			return "", fmt.Errorf("%w: bad server_name extension", ErrMalformed)
		}
	}
	return host, nil
}
