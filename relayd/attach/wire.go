package attach

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/kl-egress/kl/rules"
)

// Version is the attach protocol's version; a peer speaking another one is refused.
const Version = 1

// Frame bounds. A policy frame carries a whole rules file, so it may be as large as one
// in base64 (JSON's form of PolicyMsg.Source: 4 bytes for every 3, padded), plus the
// rest of the message.
const (
	maxSmallFrame  = 64 << 10
	maxPolicyFrame = (rules.MaxFileBytes+2)/3*4 + 64<<10
)

// Hello is the first message of a session, from the attach side on the control stream.
type Hello struct {
	Version   int      `json:"version"`
	Token     string   `json:"token,omitempty"`     // bearer token (absent with a client certificate)
	Workloads []string `json:"workloads,omitempty"` // narrow the session to these ids ("" = all it may carry)
	Selector  string   `json:"selector,omitempty"`  // narrow the session to workloads with these labels
	Client    string   `json:"client,omitempty"`    // the attach side's hostname, for logs
}

// Welcome is the daemon's answer to Hello. Error set means the session was refused and
// the connection is closing.
type Welcome struct {
	Version    int    `json:"version"`
	Session    string `json:"session,omitempty"`
	Credential string `json:"credential,omitempty"` // the configured credential that matched
	Scope      string `json:"scope,omitempty"`      // what the session may carry, in words
	Error      string `json:"error,omitempty"`
}

// PolicyMsg carries the daemon's live rules, at session start and after every reload,
// on the control stream. The attach side parses Source itself.
type PolicyMsg struct {
	Name   string `json:"name"`
	Hash   string `json:"hash"`
	Source []byte `json:"source"`
	// Earlier marks a policy older than the session's current one, sent because a flow
	// the relay decided under it (a reload landed between the decision and the dial)
	// names it: the attach side keeps it for such flows, its current policy stays.
	Earlier bool `json:"earlier,omitempty"`
}

// maxKept is how many policies an attach side keeps: flows decided just before a reload
// name the previous one.
const maxKept = 4

// kept is the policies an attach side holds, by hash, and which one is current; the
// daemon keeps the same record of what each session holds, so that a flow's header
// names only a policy the attach side has or will have. A policy added is kept unless
// maxKept newer ones were added since, and the current one is always kept.
type kept struct {
	hashes []string // oldest first
	cur    string
}

// add records policy h, as current unless earlier, and returns the hash it drops ("":
// none).
func (k *kept) add(h string, earlier bool) (dropped string) {
	if !earlier {
		k.cur = h
	}
	if k.has(h) {
		return ""
	}
	k.hashes = append(k.hashes, h)
	if len(k.hashes) <= maxKept {
		return ""
	}
	i := 0
	if k.hashes[0] == k.cur {
		i = 1
	}
	dropped = k.hashes[i]
	k.hashes = slices.Delete(k.hashes, i, i+1)
	return dropped
}

func (k *kept) has(h string) bool { return slices.Contains(k.hashes, h) }

// forget drops h unless it is the current one.
func (k *kept) forget(h string) {
	if h != k.cur {
		k.hashes = slices.DeleteFunc(k.hashes, func(x string) bool { return x == h })
	}
}

// Control is one message on the control stream. From the daemon: a policy (at session
// start and after every reload) or the abort of a flow it ended abnormally (the workload
// reset it, it idled out), without which the attach side would keep pushing the
// destination's bytes into a stream nobody reads. From the attach side: the abort of a
// flow whose destination reset the connection, so the workload's is reset too. yamux
// has no stream reset of its own.
type Control struct {
	Policy *PolicyMsg `json:"policy,omitempty"`
	Abort  uint64     `json:"abort,omitempty"`
}

// Header opens every flow stream (daemon to attach side): where the flow goes and the
// whole decision context, so the attach side can take the same decision again.
type Header struct {
	Flow      uint64            `json:"flow"`
	At        time.Time         `json:"at"`
	Workload  string            `json:"workload"`
	Namespace string            `json:"namespace,omitempty"`
	Name      string            `json:"name,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Image     string            `json:"image,omitempty"`
	Process   rules.Process     `json:"process,omitzero"`
	Host      string            `json:"host,omitempty"`
	Dst       netip.AddrPort    `json:"dst,omitzero"`
	Port      uint16            `json:"port"`
	Src       netip.Addr        `json:"src,omitzero"`
	Policy    string            `json:"policy"` // the policy's hash
	Exit      string            `json:"exit"`   // the route the daemon chose (client)
	Proxy     string            `json:"proxy,omitempty"`
}

// Verdict is the attach side's answer on a flow stream: OK and the bytes follow, or a
// refusal (the daemon resets the workload's connection) with a stable code and words.
type Verdict struct {
	OK     bool   `json:"ok"`
	Code   string `json:"code,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Refusal codes of a Verdict. They appear in the daemon's log and audit records.
const (
	RefuseRoute  = "E_ROUTE_MISMATCH" // the attach side's own decision is not client
	RefusePolicy = "E_POLICY_UNKNOWN" // the header names a policy version the attach side does not hold
	RefuseHeader = "E_BAD_HEADER"     // the header does not parse or lacks a destination
	RefuseDial   = "E_DIAL"           // the attach side could not reach the destination
	RefuseProxy  = "E_PROXY"          // the proxy the decision or the environment names is unusable
	RefuseScope  = "E_SCOPE"          // the flow's workload is not one this side asked to carry
	RefuseLocal  = "E_LOCAL"          // the destination is (or, by a name a proxy would resolve, may be) the attach side's own machine
	// RefuseDuplicate is a flow whose id is already live on the session: the aborts are
	// keyed by it, so the second flow would take the first one's (a bug or a hostile
	// daemon; the first flow goes on).
	RefuseDuplicate = "E_DUPLICATE_FLOW"
	// RefuseUnknown is what the daemon records for a code an attach side is not known to
	// send (a newer or a modified kl-ctl); the code it sent is kept in the reason.
	RefuseUnknown = "E_UNKNOWN"
)

// RulesFlow returns the rules.Flow the header describes.
func (h *Header) RulesFlow() rules.Flow {
	dst := h.Dst
	if !dst.IsValid() {
		// A flow known only by name (proxy mode) still has its port, which port rules
		// and patterns look at, as the relay's decision did.
		dst = netip.AddrPortFrom(netip.Addr{}, h.Port)
	}
	return rules.Flow{Labels: h.Labels, Image: h.Image, Process: h.Process, Host: h.Host, Dst: dst, Src: h.Src, At: h.At, ID: h.Flow}
}

// Check reports what makes a header unusable.
func (h *Header) Check() error {
	switch {
	case h.Port == 0:
		return errors.New("header: port is 0")
	case h.Host == "" && !h.Dst.IsValid():
		return errors.New("header: neither a host nor an address")
	case h.Dst.IsValid() && h.Dst.Port() != h.Port:
		return fmt.Errorf("header: port %d differs from the address's %d", h.Port, h.Dst.Port())
	case h.Policy == "":
		return errors.New("header: no policy version")
	case h.At.IsZero():
		return errors.New("header: no timestamp")
	}
	return nil
}

// writeFrame writes v as one length-prefixed JSON frame.
func writeFrame(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 4, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	_, err = w.Write(append(buf, b...))
	return err
}

// readFrame reads one frame of at most max bytes into v. Unknown fields are errors so a
// peer cannot smuggle in what this side would silently ignore.
func readFrame(r *bufio.Reader, max int, v any) error {
	var l [4]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(l[:])
	if n > uint32(max) {
		return fmt.Errorf("frame of %d bytes is over the %d-byte bound", n, max)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return fmt.Errorf("frame: %w", err)
	}
	return decodeStrict(b, v)
}

func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("frame: %w", err)
	}
	if dec.More() {
		return errors.New("frame: trailing data")
	}
	return nil
}

// streamWindow is each flow stream's receive window: the bytes one direction of a flow
// may have in flight over the session. It bounds the memory a flow can hold at the
// receiving side and, with the round trip, the flow's throughput.
var streamWindow uint32 = 1 << 20

// copyBufs are the buffers of the flows' copies: large, since each write to a stream is
// one frame the writer waits for.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}
