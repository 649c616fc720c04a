package attach

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/relayd/relay"
	"github.com/kl-egress/kl/rules"
)

// AuthError is the daemon refusing a session (wrong or missing credentials, a protocol
// version it does not speak). Reconnecting will not help.
type AuthError struct{ Msg string }

func (e *AuthError) Error() string { return "attach refused by the daemon: " + e.Msg }

// ClientOptions configure the attach side. Server and one of Token or Cert/Key are
// required.
type ClientOptions struct {
	Server     string // host:port of the daemon's attach listener (an https:// or kl:// prefix is allowed)
	ServerName string // TLS name to verify (default: the host of Server)
	CAFile     string // CA bundle to verify the daemon with (default: the system's)
	Token      string
	CertFile   string // client certificate and key, instead of a token
	KeyFile    string
	Workloads  []string // narrow the session to these workload ids
	Selector   string   // narrow the session to workloads with these labels

	// Getenv reads the proxy environment (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY,
	// lower case too); default os.Getenv.
	Getenv         func(string) string
	ConnectTimeout time.Duration // dials to destinations and proxies (default 10s)
	// AllowLocal lets flows reach this machine itself (loopback, link-local: a tunnel or
	// a corporate access helper listening on localhost). Off by default: the attach side
	// lends its network, not the services of the machine it runs on (netns.HostLocal).
	AllowLocal bool
	Log        *slog.Logger
	// OnEvent, when set, is told about every session and flow event (it must not block).
	OnEvent func(Event)

	// dialServer, dialNet and dialDest are test seams for the connection to the daemon,
	// the attach side's dials of proxies, and its direct dials of destinations (by
	// default refusing this machine's own addresses: destDialer).
	dialServer func(ctx context.Context, network, addr string) (net.Conn, error)
	dialNet    func(ctx context.Context, network, addr string) (net.Conn, error)
	dialDest   func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Event is one thing that happened on the attach side.
type Event struct {
	At       time.Time
	Kind     string // session, policy, flow, refused, end, disconnected, retry (no session: Reason says why and when the next try is)
	Session  string
	Flow     uint64
	Workload string
	Dest     string // host:port (shown by kl-ctl only with --verbose)
	Via      string // the proxy the flow went through, "" for a direct dial
	Code     string
	Reason   string
	BytesOut uint64
	BytesIn  uint64
}

// Stats are the attach side's counters, over every session it held.
type Stats struct {
	Connected  bool              `json:"connected"`
	Session    string            `json:"session,omitempty"`
	Scope      string            `json:"scope,omitempty"`
	Policy     string            `json:"policy,omitempty"`
	Since      time.Time         `json:"since,omitzero"`
	Sessions   uint64            `json:"sessions"`
	Flows      uint64            `json:"flows"`
	Active     int64             `json:"active"`
	Refused    uint64            `json:"refused"`
	BytesOut   uint64            `json:"bytesOut"`
	BytesIn    uint64            `json:"bytesIn"`
	ByCode     map[string]uint64 `json:"refusedByCode,omitempty"`
	LastError  string            `json:"lastError,omitempty"`
	Reconnects uint64            `json:"reconnects"`
}

// Client is the attach side: it holds a session to one daemon, re-decides every flow the
// daemon sends with the same policy and carries the accepted ones from its own network.
type Client struct {
	o   ClientOptions
	tls *tls.Config

	flows, refused, bytesOut, bytesIn, sessions, reconnects atomic.Uint64
	active                                                  atomic.Int64

	mu        sync.Mutex
	connected bool
	session   string
	scope     string
	since     time.Time
	lastErr   string
	byCode    map[string]uint64
	pols      *policies
	live      map[flowKey]*liveFlow // the flows being opened or carried
	ctrl      *ctrlStream           // the live session's control stream
	narrow    Selector              // the session's own --selector, checked again on every flow
}

// NewClient checks the options and loads the TLS material.
func NewClient(o ClientOptions) (*Client, error) {
	if o.Server == "" {
		return nil, errors.New("attach: no server")
	}
	o.Server = strings.TrimPrefix(strings.TrimPrefix(o.Server, "https://"), "kl://")
	o.Server = strings.TrimSuffix(o.Server, "/")
	if strings.Contains(o.Server, "@") {
		// user:password@host: credentials go in --token or a certificate, and are not
		// echoed back into a terminal or a log.
		return nil, errors.New("attach: the server address holds credentials (user@ or user:password@); give host:port, and the token with --token")
	}
	host, port, err := net.SplitHostPort(o.Server)
	if err != nil {
		return nil, fmt.Errorf("attach: server %q is not host:port", o.Server)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil, fmt.Errorf("attach: server %q: port %q is not 1-65535", o.Server, port)
	}
	if o.Token == "" && o.CertFile == "" {
		return nil, errors.New("attach: no credentials: give a token or a client certificate")
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, errors.New("attach: a client certificate needs both its file and its key")
	}
	if _, err := ParseSelector(o.Selector); err != nil {
		return nil, fmt.Errorf("attach: %w", err)
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.dialServer == nil {
		d := &net.Dialer{Timeout: o.ConnectTimeout, KeepAlive: 15 * time.Second}
		o.dialServer = d.DialContext
	}
	if o.dialNet == nil {
		d := &net.Dialer{Timeout: o.ConnectTimeout}
		o.dialNet = d.DialContext
	}
	if o.dialDest == nil {
		o.dialDest = destDialer(o.ConnectTimeout, o.AllowLocal)
	}
	tc := &tls.Config{ServerName: o.ServerName, MinVersion: tls.VersionTLS13, NextProtos: []string{"kl-attach/1"}}
	if tc.ServerName == "" {
		tc.ServerName = host
	}
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("attach: CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("attach: CA %s holds no PEM certificate", o.CAFile)
		}
		tc.RootCAs = pool
	}
	if o.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("attach: client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	narrow, _ := ParseSelector(o.Selector)
	return &Client{o: o, tls: tc, byCode: map[string]uint64{}, pols: newPolicies(), narrow: narrow, live: map[flowKey]*liveFlow{}}, nil
}

// Stats returns the counters.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	s := Stats{Connected: c.connected, Session: c.session, Scope: c.scope, Since: c.since, LastError: c.lastErr, ByCode: map[string]uint64{}}
	for k, v := range c.byCode {
		s.ByCode[k] = v
	}
	c.mu.Unlock()
	s.Policy = c.pols.current()
	s.Sessions, s.Flows, s.Refused = c.sessions.Load(), c.flows.Load(), c.refused.Load()
	s.BytesOut, s.BytesIn, s.Active, s.Reconnects = c.bytesOut.Load(), c.bytesIn.Load(), c.active.Load(), c.reconnects.Load()
	return s
}

func (c *Client) event(e Event) {
	if c.o.OnEvent != nil {
		e.At = time.Now()
		c.o.OnEvent(e)
	}
}

// Keep holds a session and reconnects with exponential backoff (200ms up to 30s, reset
// once a session has lasted a minute) until ctx is done. The daemon refusing the
// credentials ends it with an *AuthError.
func (c *Client) Keep(ctx context.Context) error {
	backoff := 200 * time.Millisecond
	for {
		start := time.Now()
		err := c.Run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var ae *AuthError
		if errors.As(err, &ae) {
			return err
		}
		if time.Since(start) > time.Minute {
			backoff = 200 * time.Millisecond
		}
		c.o.Log.Warn("attach session lost; reconnecting", "err", err, "in", backoff)
		c.event(Event{Kind: "retry", Reason: fmt.Sprintf("%v; trying again in %s", err, backoff)})
		c.reconnects.Add(1)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// Run holds one session until it ends or ctx is done (nil then).
func (c *Client) Run(ctx context.Context) (err error) {
	defer func() {
		if err != nil && ctx.Err() == nil {
			c.mu.Lock()
			c.lastErr = err.Error()
			c.mu.Unlock()
		}
	}()
	raw, err := c.connectServer(ctx)
	if err != nil {
		return fmt.Errorf("attach: connect to %s: %w", c.o.Server, err)
	}
	tc := tls.Client(raw, c.tls)
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		raw.Close()
		return fmt.Errorf("attach: TLS with %s: %w", c.o.Server, err)
	}
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	cfg.EnableKeepAlive = true
	cfg.KeepAliveInterval = 15 * time.Second
	cfg.MaxStreamWindowSize = streamWindow
	cfg.AcceptBacklog = 1024
	mux, err := yamux.Client(&coalescer{ReadWriteCloser: tc}, cfg)
	if err != nil {
		tc.Close()
		return err
	}
	defer mux.Close()
	ctrl, err := mux.OpenStream()
	if err != nil {
		return fmt.Errorf("attach: the daemon closed the session before welcoming it (does it trust the client certificate?): %w", err)
	}
	host, _ := os.Hostname()
	ctrl.SetDeadline(time.Now().Add(10 * time.Second))
	if err := writeFrame(ctrl, Hello{Version: Version, Token: c.o.Token, Workloads: c.o.Workloads, Selector: c.o.Selector, Client: host}); err != nil {
		return fmt.Errorf("attach: the daemon closed the session before welcoming it (does it trust the client certificate?): %w", err)
	}
	br := bufio.NewReader(ctrl)
	var w Welcome
	if err := readFrame(br, maxSmallFrame, &w); err != nil {
		return fmt.Errorf("attach: the daemon closed the session before welcoming it (does it trust the client certificate?): %w", err)
	}
	if w.Error != "" {
		return &AuthError{Msg: w.Error}
	}
	var first Control
	if err := readFrame(br, maxPolicyFrame, &first); err != nil {
		return fmt.Errorf("attach: no policy from the daemon: %w", err)
	}
	if first.Policy == nil {
		return errors.New("attach: the daemon sent no policy")
	}
	pm := first.Policy
	if err := c.pols.add(pm); err != nil {
		return err
	}
	ctrl.SetDeadline(time.Time{})
	c.sessions.Add(1)
	c.mu.Lock()
	c.connected, c.session, c.scope, c.since = true, w.Session, w.Scope, time.Now()
	c.ctrl = &ctrlStream{session: w.Session, st: ctrl}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.connected, c.ctrl = false, nil
		c.mu.Unlock()
	}()
	c.o.Log.Info("attach session started", "session", w.Session, "credential", w.Credential, "scope", w.Scope, "policy", pm.Hash)
	c.event(Event{Kind: "session", Session: w.Session, Reason: w.Scope})
	c.event(Event{Kind: "policy", Session: w.Session, Reason: pm.Hash})

	ctlErr := make(chan error, 1)
	go func() {
		for {
			var m Control
			if err := readFrame(br, maxPolicyFrame, &m); err != nil {
				ctlErr <- err
				return
			}
			if m.Abort != 0 {
				c.abort(w.Session, m.Abort)
			}
			pm := m.Policy
			if pm == nil {
				continue
			}
			if err := c.pols.add(pm); err != nil {
				c.o.Log.Error("attach: the daemon's policy does not load here; flows under it will be refused", "err", err)
				continue
			}
			if pm.Earlier {
				c.o.Log.Debug("attach: an earlier policy kept for flows decided under it", "policy", pm.Hash)
				continue
			}
			c.o.Log.Info("attach: policy updated", "policy", pm.Hash)
			c.event(Event{Kind: "policy", Session: w.Session, Reason: pm.Hash})
		}
	}()
	// The session's flows live no longer than the session: when it ends (or ctx is
	// done) every flow is cut, dials included, whatever its destination does. Otherwise a
	// flow to a destination that stays silent would hold this Run, and with it the
	// reconnect, until the destination spoke or closed. The session is closed before
	// its flows are cut: a flow's cut closes its stream, which on a live session would
	// send the daemon a half-close, and the workload would take its flow for complete.
	sctx, endSession := context.WithCancel(context.WithoutCancel(ctx))
	defer endSession()
	go func() {
		select {
		case <-ctx.Done():
		case <-mux.CloseChan():
		}
		mux.Close()
		endSession()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		st, err := mux.AcceptStream()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			select {
			case e := <-ctlErr:
				err = e
			default:
			}
			c.event(Event{Kind: "disconnected", Session: w.Session, Reason: err.Error()})
			return fmt.Errorf("attach: session ended: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.flow(sctx, w.Session, st)
		}()
	}
}

// flow handles one flow stream: re-decide, dial from this side's network, answer, copy.
// ctx is the session's: when it is done the flow is cut.
func (c *Client) flow(ctx context.Context, sess string, st *yamux.Stream) {
	defer st.Close()
	c.flows.Add(1)
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReaderSize(st, 4096)
	var h Header
	refuse := func(code, reason string) {
		c.refused.Add(1)
		c.mu.Lock()
		c.byCode[code]++
		c.mu.Unlock()
		st.SetWriteDeadline(time.Now().Add(5 * time.Second))
		writeFrame(st, Verdict{Code: code, Reason: reason})
		c.o.Log.Info("attach: flow refused", "flow", h.Flow, "workload", h.Workload, "code", code, "reason", reason)
		c.event(Event{Kind: "refused", Session: sess, Flow: h.Flow, Workload: h.Workload, Dest: h.dest(), Code: code, Reason: reason})
	}
	if err := readFrame(br, maxSmallFrame, &h); err != nil {
		refuse(RefuseHeader, err.Error())
		return
	}
	if err := h.Check(); err != nil {
		refuse(RefuseHeader, err.Error())
		return
	}
	lf, release := c.reserve(sess, h.Flow)
	if lf == nil {
		refuse(RefuseDuplicate, fmt.Sprintf("flow %d is already live on this session", h.Flow))
		return
	}
	defer release()
	if !c.wants(&h) {
		refuse(RefuseScope, "workload "+h.Workload+" is not one this session asked to carry")
		return
	}
	p := c.pols.wait(h.Policy, 2*time.Second)
	if p == nil {
		refuse(RefusePolicy, "policy "+short(h.Policy)+" is not the one this session holds")
		return
	}
	// The decision this side would take itself, from the same policy bytes and the same
	// deterministic inputs: a workload cannot promote its own route past this check.
	f := h.RulesFlow()
	d := p.Decide(&f)
	if d.Exit != rules.ExitClient {
		refuse(RefuseRoute, fmt.Sprintf("this side decides %s (%s rule %d), not client", d.Exit, d.Dimension, d.Rule))
		return
	}
	if d.Proxy != h.Proxy {
		refuse(RefuseRoute, fmt.Sprintf("this side decides proxy %q, the daemon claims %q", d.Proxy, h.Proxy))
		return
	}
	// Where to dial: the name only when it decided this side's decision too, else the
	// address that was checked (as the relay hands its exits, relay.NameDecided).
	dh := dialHeader(p, &h, &f, d)
	dctx, cancel := context.WithTimeout(ctx, c.o.ConnectTimeout)
	up, via, err := c.dial(dctx, dh, d.Proxy)
	cancel()
	if err != nil {
		code := RefuseDial
		var pe *proxyError
		switch {
		case errors.Is(err, errThisMachine), errors.Is(err, errNotHostName):
			code = RefuseLocal
		case errors.As(err, &pe):
			code = RefuseProxy
		}
		// The reason goes back to the daemon, into its log and audit records, which never
		// hold a destination (SPEC §5): drop the addresses a dial error names.
		refuse(code, audit.Reason(err))
		return
	}
	defer up.Close()
	st.SetDeadline(time.Time{})
	if err := writeFrame(st, Verdict{OK: true}); err != nil {
		return
	}
	c.active.Add(1)
	defer c.active.Add(-1)
	// The daemon ended the flow abnormally, or the session ended: reset the destination
	// too.
	cut := func() {
		if tc, ok := up.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		up.Close()
		st.Close()
	}
	lf.setCut(cut)
	stopCut := context.AfterFunc(ctx, cut)
	defer stopCut()
	c.event(Event{Kind: "flow", Session: sess, Flow: h.Flow, Workload: h.Workload, Dest: dh.dest(), Via: via})
	out, in := c.pipe(sess, h.Flow, st, br, up)
	c.event(Event{Kind: "end", Session: sess, Flow: h.Flow, Workload: h.Workload, Dest: dh.dest(), Via: via, BytesOut: out, BytesIn: in})
}

type ctrlStream struct {
	session string
	mu      sync.Mutex
	st      *yamux.Stream
}

type flowKey struct {
	session string
	id      uint64
}

// liveFlow is a flow of the live table: its abort, once it is being carried. An abort
// that comes before (the daemon may end the flow as soon as it has read the verdict,
// before this side set the abort) is kept and done by setCut.
type liveFlow struct {
	mu      sync.Mutex
	cut     func()
	aborted bool
}

func (lf *liveFlow) setCut(cut func()) {
	lf.mu.Lock()
	lf.cut = cut
	aborted := lf.aborted
	lf.mu.Unlock()
	if aborted {
		cut()
	}
}

func (lf *liveFlow) abort() {
	lf.mu.Lock()
	lf.aborted = true
	cut := lf.cut
	lf.mu.Unlock()
	if cut != nil {
		cut()
	}
}

// reserve enters flow id of session sess in the live table until release is called; a
// nil *liveFlow when a flow with that id is there already. The daemon's aborts name a
// flow by id, so a second flow with a live id would take the first one's abort, and
// the first one's end would drop the second from the table.
func (c *Client) reserve(sess string, id uint64) (lf *liveFlow, release func()) {
	k := flowKey{sess, id}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.live[k]; ok {
		return nil, nil
	}
	lf = &liveFlow{}
	c.live[k] = lf
	return lf, func() {
		c.mu.Lock()
		if c.live[k] == lf {
			delete(c.live, k)
		}
		c.mu.Unlock()
	}
}

// sendAbort tells the daemon that the destination reset flow id.
func (c *Client) sendAbort(sess string, id uint64) bool {
	c.mu.Lock()
	ctl := c.ctrl
	c.mu.Unlock()
	if ctl == nil || ctl.session != sess {
		return false
	}
	ctl.mu.Lock()
	defer ctl.mu.Unlock()
	ctl.st.SetWriteDeadline(time.Now().Add(5 * time.Second))
	defer ctl.st.SetWriteDeadline(time.Time{})
	return writeFrame(ctl.st, Control{Abort: id}) == nil
}

func (c *Client) abort(sess string, id uint64) {
	c.mu.Lock()
	lf := c.live[flowKey{sess, id}]
	c.mu.Unlock()
	if lf != nil {
		lf.abort()
	}
}

// wants reports whether the flow's workload is within what this side asked to carry
// (the daemon enforces the credential's grant; this is the attach side's own check).
func (c *Client) wants(h *Header) bool {
	if len(c.o.Workloads) > 0 && !slices.Contains(c.o.Workloads, h.Workload) {
		return false
	}
	return c.narrow == nil || c.narrow.Matches(h.Labels)
}

func (h *Header) dest() string {
	if h.Host != "" {
		return net.JoinHostPort(h.Host, strconv.Itoa(int(h.Port)))
	}
	if h.Dst.IsValid() {
		return h.Dst.String()
	}
	return ""
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// pipe copies both ways between the stream and the destination until both directions
// end, passing half-closes on, and counts the bytes.
func (c *Client) pipe(sess string, id uint64, st *yamux.Stream, br *bufio.Reader, up net.Conn) (out, in uint64) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		bp := copyBufs.Get().(*[]byte)
		defer copyBufs.Put(bp)
		n, _ := io.CopyBuffer(countWriter{up, &c.bytesOut}, struct{ io.Reader }{br}, *bp)
		out = uint64(n)
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			up.Close()
		}
	}()
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	n, err := io.CopyBuffer(countWriter{st, &c.bytesIn}, struct{ io.Reader }{up}, *bp)
	in = uint64(n)
	if errors.Is(err, syscall.ECONNRESET) && c.sendAbort(sess, id) {
		// The destination reset the connection: the daemon resets the workload's too
		// (it answers with its own abort, which closes the stream here), rather than a
		// clean end of stream.
		wg.Wait()
		return out, in
	}
	st.Close()
	wg.Wait()
	return out, in
}

type countWriter struct {
	w io.Writer
	n *atomic.Uint64
}

func (c countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n.Add(uint64(n))
	return n, err
}

// policies holds the versions of the daemon's policy this side has parsed, by hash. A
// reload races the flows decided under it, so a flow may name a version that arrives a
// moment later; the last few versions stay (kept) for flows decided just before a
// reload, and the daemon sends an earlier one again (PolicyMsg.Earlier) when a flow
// names one this side no longer holds.
type policies struct {
	mu  sync.Mutex
	byH map[string]*rules.Policy
	k   kept
	ch  chan struct{} // closed and replaced on every add
}

func newPolicies() *policies {
	return &policies{byH: map[string]*rules.Policy{}, ch: make(chan struct{})}
}

func (ps *policies) add(pm *PolicyMsg) error {
	// The daemon already enforced its own gateway and exit settings when it loaded these
	// bytes; this side only needs the same decisions, so it accepts what loaded there.
	p, err := rules.Parse(pm.Name, pm.Source, rules.LoadOptions{AllowGateway: true})
	if err != nil {
		return fmt.Errorf("attach: the daemon's policy %s: %w", short(pm.Hash), err)
	}
	if p.Hash() != pm.Hash {
		return fmt.Errorf("attach: the daemon's policy hashes to %s, not %s as announced", short(p.Hash()), short(pm.Hash))
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if !ps.k.has(pm.Hash) {
		ps.byH[pm.Hash] = p
	}
	delete(ps.byH, ps.k.add(pm.Hash, pm.Earlier))
	close(ps.ch)
	ps.ch = make(chan struct{})
	return nil
}

func (ps *policies) current() string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.k.cur
}

func (ps *policies) wait(hash string, d time.Duration) *rules.Policy {
	deadline := time.After(d)
	for {
		ps.mu.Lock()
		p, ch := ps.byH[hash], ps.ch
		ps.mu.Unlock()
		if p != nil {
			return p
		}
		select {
		case <-ch:
		case <-deadline:
			return nil
		}
	}
}

// target is where this side dials: the hostname when the daemon knew it (it then
// resolves here, on the operator's network: VPN and corporate DNS included), else the
// address.
func (h *Header) target() string {
	if h.Host != "" {
		return net.JoinHostPort(h.Host, strconv.Itoa(int(h.Port)))
	}
	return h.Dst.String()
}

// dialHeader is h as this side dials it: with its hostname only when decision d (this
// side's own, under p, of f = h.RulesFlow()) rested on that name, or when the name is
// the only destination the header has. A header carrying both a name and an address
// whose decision did not rest on the name is dialled at the address, the one the
// decision checked: the name is the workload's own word (SNI, Host) and, resolved
// here, could lead anywhere. The relay hands its exits the name by the same rule
// (relay.NameDecided), so a correct daemon never sends such a header; this side does
// not take that on trust.
//
// A header with a name and no address (proxy mode) is dialled by the name: the relay
// resolves a name whose address could change the decision (rules.Policy.NeedsAddr) and
// sends the address then, so only a name no address could have decided otherwise
// arrives alone; checking that here would need this side to resolve it first.
func dialHeader(p *rules.Policy, h *Header, f *rules.Flow, d rules.Decision) *Header {
	if h.Host == "" || !h.Dst.IsValid() || relay.NameDecided(p, f, d) {
		return h
	}
	dh := *h
	dh.Host = ""
	return &dh
}
