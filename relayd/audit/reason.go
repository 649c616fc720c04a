package audit

import (
	"errors"
	"net"
	"strings"
)

// Reason turns an error into a Record.Reason without the destination: the text of any
// *net.OpError in the chain loses its addresses ("dial tcp 203.0.113.7:443: connect:
// connection refused" becomes "dial tcp: connect: connection refused") and a
// *net.DNSError loses the name it looked up. Upstream proxy addresses (the operator's
// configuration, not the flow's) are kept.
func Reason(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	for e := err; e != nil; e = unwrapOne(e) {
		switch v := e.(type) {
		case *net.OpError:
			clean := v.Op
			if v.Net != "" {
				clean += " " + v.Net
			}
			if v.Err != nil {
				clean += ": " + Reason(v.Err)
			}
			s = strings.Replace(s, v.Error(), clean, 1)
		case *net.DNSError:
			clean := "lookup failed: " + v.Err
			if v.IsNotFound {
				clean = "lookup failed: no such host"
			}
			s = strings.Replace(s, v.Error(), clean, 1)
		case *net.AddrError:
			s = strings.Replace(s, v.Error(), v.Err, 1)
		}
	}
	return s
}

func unwrapOne(err error) error {
	if u, ok := err.(interface{ Unwrap() []error }); ok {
		if es := u.Unwrap(); len(es) > 0 {
			return es[0]
		}
		return nil
	}
	return errors.Unwrap(err)
}

// Redacted wraps err so that its text is Reason(err) (no destination) while errors.Is and
// errors.As still see the whole chain (a caller can still tell a refused connection or a
// timeout apart). nil stays nil.
func Redacted(err error) error {
	if err == nil {
		return nil
	}
	return &redacted{msg: Reason(err), err: err}
}

type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }
