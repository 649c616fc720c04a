package attach

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/rules"
)

// Errors of Server.Dial. Each is wrapped in a *net.OpError (Op "attach") whose text names
// no destination, so logs and audit records keep the reason and nothing else.
var (
	ErrNoSession = errors.New("no live attach session for the workload")
	ErrNotClient = errors.New("the policy does not route this flow to the client")
	ErrRefused   = errors.New("refused by the attach side")
	// ErrDuplicateFlow is a flow whose id is already live on the session: the ids key
	// the aborts both ways, so a second one could end or outlive the first.
	ErrDuplicateFlow = errors.New("a flow with the same id is live on the session")
)

// RefusedError is an attach side's refusal of one flow.
type RefusedError struct{ Code, Reason string }

func (e *RefusedError) Error() string {
	return fmt.Sprintf("refused by the attach side: %s: %s", e.Code, e.Reason)
}

func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// maxRefusalReason bounds the reason of an attach side's refusal as the daemon keeps it.
const maxRefusalReason = 200

// refusal is the attach side's refusal as the daemon logs and records it. The attach
// side is the operator's program, but its words land in the node's log and audit records:
// a code it is not known to send reads E_UNKNOWN (with the code it sent in the reason),
// and the reason keeps printable ASCII only, cut to maxRefusalReason bytes.
func refusal(v Verdict) *RefusedError {
	code, reason := v.Code, v.Reason
	switch code {
	case RefuseRoute, RefusePolicy, RefuseHeader, RefuseDial, RefuseProxy, RefuseScope, RefuseLocal, RefuseDuplicate:
	default:
		reason = fmt.Sprintf("code %q: %s", code, reason)
		code = RefuseUnknown
	}
	b := make([]byte, 0, min(len(reason), maxRefusalReason))
	for i := 0; i < len(reason) && len(b) < maxRefusalReason; i++ {
		if c := reason[i]; c >= 0x20 && c < 0x7f {
			b = append(b, c)
		}
	}
	return &RefusedError{Code: code, Reason: string(b)}
}

// ServerOptions configure a Server. Settings and Policy are required.
type ServerOptions struct {
	Settings *Settings
	// Policy is the daemon's live rule set; it is sent when a session starts and, after
	// Reload, to every session.
	Policy func() *rules.Policy
	Log    *slog.Logger
	// Audit, when set, receives a record for every client flow refused at this hop.
	Audit *audit.Log
	// HandshakeTimeout bounds TLS, Hello and Welcome (default 10s).
	HandshakeTimeout time.Duration
	// IdleTimeout is how long a half-closed flow stream may linger (default 10m).
	IdleTimeout time.Duration
}

// Server is the daemon side: it accepts attach sessions, keeps the registry of live
// sessions and carries `client` flows over them.
type Server struct {
	o     ServerOptions
	tls   *tls.Config
	creds []Credential

	mu       sync.Mutex
	sessions map[string]*session
	seq      atomic.Uint64
	closed   bool
	wg       sync.WaitGroup
	observed atomic.Pointer[observed] // the live policy as last read (policy)
}

type session struct {
	id      string
	cred    string
	client  string
	remote  string
	scope   *scope
	mux     *yamux.Session
	fins    *finWatch // which flow streams the attach side half-closed
	started time.Time

	log *slog.Logger

	ctrlMu sync.Mutex // one write at a time on ctrl: the handshake's, then the writer's
	ctrl   net.Conn
	// sent is the hash of the policy the session holds, written by the writer; status
	// reads it without waiting behind a write to a slow peer.
	sent atomic.Pointer[string]

	// What the writer (writeLoop) has to send on ctrl, so no flow, reload or Close waits
	// behind a write to a slow peer. Policies go in the order of their generation: one
	// older than the newest queued is never queued, so it never replaces a newer one.
	qMu      sync.Mutex
	pending  []queuedPolicy // oldest first, at most maxPendingPolicies
	aborts   []uint64
	newest   queuedPolicy  // the newest policy queued or sent
	held     kept          // the policies the attach side holds once pending is written
	sentGen  uint64        // the generation of the last policy written
	progress chan struct{} // closed and replaced when sentGen advances
	wake     chan struct{} // capacity 1: something was queued

	flows   atomic.Uint64
	refused atomic.Uint64

	liveMu sync.Mutex
	live   map[uint64]*flowConn // flows being opened (nil) or carried, by id
	// resetEarly holds the flows being opened whose reset came before they were carried:
	// the attach side sends it as soon as its destination resets, on the control
	// stream, which may be read before the flow's verdict is.
	resetEarly map[uint64]bool
}

// reserve claims id for a flow being opened; false when a flow with that id is live on
// the session already (the aborts both ways are keyed by it).
func (se *session) reserve(id uint64) bool {
	se.liveMu.Lock()
	defer se.liveMu.Unlock()
	if _, ok := se.live[id]; ok {
		return false
	}
	se.live[id] = nil
	return true
}

// release gives up id, if c (nil: a flow still being opened) holds it.
func (se *session) release(id uint64, c *flowConn) {
	se.liveMu.Lock()
	defer se.liveMu.Unlock()
	if held, ok := se.live[id]; ok && held == c {
		delete(se.live, id)
		delete(se.resetEarly, id)
	}
}

// track makes c the holder of its reserved id.
func (se *session) track(c *flowConn) *flowConn {
	se.liveMu.Lock()
	se.live[c.id] = c
	if se.resetEarly[c.id] {
		delete(se.resetEarly, c.id)
		c.peerReset.Store(true) // no read has begun: Read sees it first
	}
	se.liveMu.Unlock()
	return c
}

// reset ends a flow the attach side saw reset by its destination: the relay's read
// fails with ECONNRESET, so the workload's connection is reset too.
func (se *session) reset(id uint64) {
	se.liveMu.Lock()
	c, ok := se.live[id]
	if ok && c == nil {
		if se.resetEarly == nil {
			se.resetEarly = map[uint64]bool{}
		}
		se.resetEarly[id] = true
	}
	se.liveMu.Unlock()
	if c != nil {
		c.peerReset.Store(true)
		c.Stream.SetReadDeadline(time.Now())
	}
}

// SessionInfo describes a live session for status output.
type SessionInfo struct {
	ID         string    `json:"id"`
	Credential string    `json:"credential"`
	Client     string    `json:"client,omitempty"`
	Remote     string    `json:"remote"`
	Scope      string    `json:"scope"`
	Since      time.Time `json:"since"`
	Policy     string    `json:"policy"`
	Flows      uint64    `json:"flows"`
	Refused    uint64    `json:"refused"`
}

// NewServer loads the certificates the settings name and checks the credentials.
func NewServer(o ServerOptions) (*Server, error) {
	if !o.Settings.Enabled() {
		return nil, errors.New("attach: no listen address configured")
	}
	if err := o.Settings.Validate(); err != nil {
		return nil, err
	}
	if o.Policy == nil {
		return nil, errors.New("attach: no policy")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 10 * time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 10 * time.Minute
	}
	cert, err := tls.LoadX509KeyPair(o.Settings.Cert, o.Settings.Key)
	if err != nil {
		return nil, fmt.Errorf("attach: server certificate: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13, NextProtos: []string{"kl-attach/1"}}
	if o.Settings.ClientCA != "" {
		pem, err := os.ReadFile(o.Settings.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("attach: clientCA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("attach: clientCA %s holds no PEM certificate", o.Settings.ClientCA)
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return &Server{o: o, tls: tc, creds: o.Settings.Credentials, sessions: map[string]*session{}}, nil
}

// Serve accepts attach connections on ln (plain TCP; Serve adds TLS) until ctx is done,
// then closes every connection, sessions and handshakes alike. A Server serves one
// listener at a time; it may serve again after Serve returned (the daemon restarting its
// listener).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.mu.Lock()
	s.closed = false
	s.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer s.closeAll()
	// Every connection's handler closes it when ctx is done: none outlives Serve, not one
	// still in its handshake either.
	defer cancel()
	go func() { <-ctx.Done(); ln.Close() }()
	// Connections that have not authenticated yet are bounded, so a flood of them cannot
	// exhaust the daemon; authenticated sessions do not count.
	var pending pendingConns
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.o.Log.Warn("attach: accept failed", "err", err, "retry", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		pc, evicted := pending.add(c)
		if evicted != nil {
			s.o.Log.Warn("attach: too many connections in their handshake; dropped the oldest", "remote", evicted.RemoteAddr().String(),
				"for", c.RemoteAddr().String(), "limit", maxPending, "perSource", maxPendingPerSource)
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handle(ctx, c, func() { pending.done(pc) })
		}()
	}
}

func (s *Server) closeAll() {
	s.mu.Lock()
	s.closed = true
	ss := make([]*session, 0, len(s.sessions))
	for _, se := range s.sessions {
		ss = append(ss, se)
	}
	s.mu.Unlock()
	for _, se := range ss {
		se.mux.Close()
	}
	s.wg.Wait()
}

func (s *Server) muxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = io.Discard
	c.EnableKeepAlive = true
	c.KeepAliveInterval = 15 * time.Second
	c.StreamOpenTimeout = s.o.HandshakeTimeout
	c.StreamCloseTimeout = s.o.IdleTimeout
	c.MaxStreamWindowSize = streamWindow
	// The attach side opens one stream, the control stream; the flows' streams are the
	// daemon's to open. Streams beyond what the backlog holds are reset by yamux.
	c.AcceptBacklog = 1
	return c
}

// handle runs one attach connection: handshake, authentication, then the session until
// either side or ctx ends it.
func (s *Server) handle(ctx context.Context, raw net.Conn, authenticated func()) {
	var once sync.Once
	done := func() { once.Do(authenticated) }
	defer done()
	// After TLS, the reads of the control stream and the Hello, and the first policy's
	// write, do not watch ctx: closing the connection ends them.
	defer context.AfterFunc(ctx, func() { raw.Close() })()
	remote := raw.RemoteAddr().String()
	log := s.o.Log.With("remote", remote)
	deadline := time.Now().Add(s.o.HandshakeTimeout)
	raw.SetDeadline(deadline)
	if first := time.Now().Add(firstBytesTimeout); first.Before(deadline) {
		raw.SetReadDeadline(first)
	}
	c := tls.Server(&firstBytes{Conn: raw, then: deadline}, s.tls)
	if err := c.HandshakeContext(ctx); err != nil {
		log.Warn("attach refused: TLS handshake failed", "err", err)
		c.Close()
		return
	}
	fins := &finWatch{}
	mux, err := yamux.Server(&coalescer{ReadWriteCloser: c, fins: fins}, s.muxConfig())
	if err != nil {
		c.Close()
		return
	}
	defer mux.Close()
	ctrl, err := mux.AcceptStream()
	if err != nil {
		log.Warn("attach refused: no control stream", "err", err)
		return
	}
	// Nothing reads a second stream from the attach side: each would hold up to a window
	// of the peer's data (before authentication too) until the session ended. A peer
	// that opens one does not speak the protocol; its session ends.
	go func() {
		if st, err := mux.AcceptStream(); err == nil {
			log.Warn("attach: the attach side opened a second stream; ending the session")
			st.Close()
			mux.Close()
		}
	}()
	br := bufio.NewReader(ctrl)
	var h Hello
	if err := readFrame(br, maxSmallFrame, &h); err != nil {
		log.Warn("attach refused: bad hello", "err", err)
		return
	}
	refuse := func(why, said string) {
		log.Warn("attach refused", "reason", why, "client", h.Client)
		writeFrame(ctrl, Welcome{Version: Version, Error: said})
		ctrl.Close()
		// Let the refusal reach the other side before the connection goes.
		time.Sleep(50 * time.Millisecond)
	}
	if h.Version != Version {
		refuse(fmt.Sprintf("protocol version %d", h.Version), fmt.Sprintf("protocol version %d is not supported (want %d)", h.Version, Version))
		return
	}
	cred, how := s.authenticate(c.ConnectionState(), h.Token)
	if cred == nil {
		refuse(how, "authentication failed")
		return
	}
	sc, err := newScope(cred, &h)
	if err != nil {
		refuse("bad scope: "+err.Error(), err.Error())
		return
	}
	c.SetDeadline(time.Time{})
	done()
	se := &session{id: newID(), cred: cred.Name, client: h.Client, remote: remote, scope: sc, mux: mux, fins: fins, started: time.Now(), log: log,
		ctrl: ctrl, live: map[uint64]*flowConn{}, progress: make(chan struct{}), wake: make(chan struct{}, 1)}
	if err := writeFrame(ctrl, Welcome{Version: Version, Session: se.id, Credential: cred.Name, Scope: sc.String()}); err != nil {
		return
	}
	p, gen := s.policy()
	first := queuedPolicy{p: p, gen: gen, by: time.Now().Add(policySendTimeout)}
	if err := se.write(Control{Policy: &PolicyMsg{Name: p.Name(), Hash: p.Hash(), Source: p.Source()}}, first.by); err != nil {
		log.Warn("attach: sending the policy failed", "err", err)
		return
	}
	se.newest = first
	se.held.add(p.Hash(), false)
	se.sentPolicy(first)
	go se.writeLoop()
	if !s.add(se) {
		return
	}
	// A reload between reading the policy above and the session's joining the registry
	// did not see the session, but it moved the generation on.
	if o := s.observed.Load(); o.gen > first.gen {
		se.want(o.p, o.gen, time.Now().Add(policySendTimeout))
	}
	log.Info("attach session started", "session", se.id, "credential", cred.Name, "auth", how, "client", h.Client, "scope", sc.String())
	// The attach side sends nothing more on the control stream: EOF or an error there,
	// or the session dying, ends the session.
	eof := make(chan struct{})
	go func() {
		defer close(eof)
		for {
			var m Control
			if err := readFrame(br, maxSmallFrame, &m); err != nil {
				return
			}
			if m.Abort != 0 {
				se.reset(m.Abort)
			}
		}
	}()
	select {
	case <-eof:
	case <-mux.CloseChan():
	case <-ctx.Done():
	}
	s.remove(se)
	mux.Close()
	log.Info("attach session ended", "session", se.id, "credential", cred.Name, "flows", se.flows.Load(), "refused", se.refused.Load(), "lasted", time.Since(se.started).Round(time.Millisecond))
}

// authenticate finds the credential a connection presents: a verified client
// certificate whose subject a credential names, else a bearer token.
func (s *Server) authenticate(st tls.ConnectionState, token string) (*Credential, string) {
	if len(st.VerifiedChains) > 0 {
		leaf := st.VerifiedChains[0][0]
		names := append([]string{leaf.Subject.CommonName}, leaf.DNSNames...)
		for i := range s.creds {
			c := &s.creds[i]
			for _, n := range names {
				if c.Subject != "" && n == c.Subject {
					return c, "certificate"
				}
			}
		}
		if token == "" {
			return nil, fmt.Sprintf("certificate %q matches no credential", leaf.Subject.CommonName)
		}
	}
	if token == "" {
		return nil, "no token and no client certificate"
	}
	var found *Credential
	for i := range s.creds {
		// Compare with every credential, so timing does not tell which one is close.
		if s.creds[i].tokenMatches(token) && found == nil {
			found = &s.creds[i]
		}
	}
	if found == nil {
		return nil, "wrong token"
	}
	return found, "token"
}

func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *Server) add(se *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.sessions[se.id] = se
	return true
}

func (s *Server) remove(se *session) {
	s.mu.Lock()
	delete(s.sessions, se.id)
	s.mu.Unlock()
}

// policySendTimeout bounds the delivery of a policy to a session (at session start,
// after a reload, or when a flow finds the session without the live policy); a session
// whose peer has not taken it in that time is ended.
var policySendTimeout = 10 * time.Second

// abortSendTimeout bounds the write of one flow's abort on the control stream.
const abortSendTimeout = 5 * time.Second

// maxPendingPolicies bounds the policies queued for a session and not yet written: the
// attach side keeps the last maxKept it was sent, so an older one would be of no use there.
const maxPendingPolicies = maxKept

// queuedPolicy is a policy with its generation (Server.policy), and the time by which
// it must have been written. An earlier one (hold) has no generation and does not
// become the session's current policy.
type queuedPolicy struct {
	p       *rules.Policy
	gen     uint64
	by      time.Time
	earlier bool
}

// observed is the live policy as the server last read it, with its generation: the
// number of different policies read before it, plus one.
type observed struct {
	p   *rules.Policy
	gen uint64
}

// policy reads the live policy and its generation. Generations follow the order in
// which the daemon loaded the policies (its live policy only ever moves to a newer
// one): a read is taken only if no other was taken between its look at the last
// observation and its read of the policy, else it reads again.
func (s *Server) policy() (*rules.Policy, uint64) {
	for {
		last := s.observed.Load()
		p := s.o.Policy()
		if last != nil && last.p.Hash() == p.Hash() {
			return last.p, last.gen
		}
		next := &observed{p: p, gen: 1}
		if last != nil {
			next.gen = last.gen + 1
		}
		if s.observed.CompareAndSwap(last, next) {
			return p, next.gen
		}
	}
}

// want queues p, of generation gen, for the session unless the session was queued that
// generation or a newer one already; the write must be done by by. It returns the
// newest policy the session was queued or sent, the one a flow's header should name.
func (se *session) want(p *rules.Policy, gen uint64, by time.Time) *rules.Policy {
	se.qMu.Lock()
	defer se.qMu.Unlock()
	if gen <= se.newest.gen {
		return se.newest.p
	}
	se.newest = queuedPolicy{p: p, gen: gen, by: by}
	se.held.add(p.Hash(), false)
	se.enqueue(se.newest)
	return p
}

// hold queues p, the policy that decided a flow whose header names it, for the session
// unless the attach side holds it or was queued it already: an earlier policy (a reload
// landed between the relay's decision and the dial), kept there for such flows without
// replacing the current one. The write must be done by by.
func (se *session) hold(p *rules.Policy, by time.Time) {
	se.qMu.Lock()
	defer se.qMu.Unlock()
	if se.held.has(p.Hash()) {
		return
	}
	se.held.add(p.Hash(), true)
	se.enqueue(queuedPolicy{p: p, by: by, earlier: true})
}

// enqueue queues q for the writer (qMu held). A full queue drops its oldest policy that
// is not the current one: the attach side would drop it for the newer ones anyway.
func (se *session) enqueue(q queuedPolicy) {
	if len(se.pending) == maxPendingPolicies {
		i := slices.IndexFunc(se.pending, func(x queuedPolicy) bool { return x.p.Hash() != se.held.cur })
		i = max(i, 0)
		se.held.forget(se.pending[i].p.Hash())
		se.pending = slices.Delete(se.pending, i, i+1)
	}
	se.pending = append(se.pending, q)
	se.poke()
}

// abort tells the attach side to drop a flow; the write is the writer's, so Close does
// not block on a slow session.
func (se *session) abort(id uint64) {
	if se.mux.IsClosed() {
		return
	}
	se.qMu.Lock()
	se.aborts = append(se.aborts, id)
	se.poke()
	se.qMu.Unlock()
}

// poke wakes the writer.
func (se *session) poke() {
	select {
	case se.wake <- struct{}{}:
	default:
	}
}

// writeLoop writes what is queued for the control stream until the session ends. A
// write that fails (its peer did not take it in time) ends the session.
func (se *session) writeLoop() {
	for {
		select {
		case <-se.wake:
		case <-se.mux.CloseChan():
			return
		}
		for {
			se.qMu.Lock()
			var m Control
			var by time.Time
			var q queuedPolicy
			switch {
			case len(se.aborts) > 0:
				m.Abort, by = se.aborts[0], time.Now().Add(abortSendTimeout)
				se.aborts = se.aborts[1:]
			case len(se.pending) > 0:
				q = se.pending[0]
				se.pending = se.pending[1:]
				m.Policy = &PolicyMsg{Name: q.p.Name(), Hash: q.p.Hash(), Source: q.p.Source(), Earlier: q.earlier}
				by = q.by
			}
			se.qMu.Unlock()
			if m.Abort == 0 && m.Policy == nil {
				break
			}
			if err := se.write(m, by); err != nil {
				if !se.mux.IsClosed() {
					se.log.Warn("attach: a write on the control stream failed; ending the session", "session", se.id, "err", err)
				}
				se.mux.Close()
				return
			}
			if m.Policy != nil && !q.earlier {
				se.sentPolicy(q)
			}
		}
	}
}

// write writes m on the control stream, by the given time however long the stream was
// busy before.
func (se *session) write(m Control, by time.Time) error {
	se.ctrlMu.Lock()
	defer se.ctrlMu.Unlock()
	se.ctrl.SetWriteDeadline(by)
	defer se.ctrl.SetWriteDeadline(time.Time{})
	return writeFrame(se.ctrl, m)
}

// sentPolicy records that q was written.
func (se *session) sentPolicy(q queuedPolicy) {
	h := q.p.Hash()
	se.sent.Store(&h)
	se.qMu.Lock()
	se.sentGen = q.gen
	close(se.progress)
	se.progress = make(chan struct{})
	se.qMu.Unlock()
}

// errNotTaken is a policy a session's peer did not take in time.
var errNotTaken = errors.New("the session did not take the policy in time")

// waitSent waits until the session was sent generation gen or a newer one, the session
// ended, or the time by passed.
func (se *session) waitSent(gen uint64, by time.Time) error {
	timer := time.NewTimer(time.Until(by))
	defer timer.Stop()
	for {
		se.qMu.Lock()
		sent, progress := se.sentGen, se.progress
		se.qMu.Unlock()
		if sent >= gen {
			return nil
		}
		select {
		case <-progress:
		case <-se.mux.CloseChan():
			return errors.New("the session ended")
		case <-timer.C:
			return errNotTaken
		}
	}
}

// sentHash is the hash of the policy the session holds ("" before the first).
func (se *session) sentHash() string {
	if h := se.sent.Load(); h != nil {
		return *h
	}
	return ""
}

// Reload queues the live policy for every session that was not queued it yet; each
// session's writer sends it, so a session whose peer stopped reading delays no other.
// A session that has not taken the policy within policySendTimeout (its write failed, or
// its control stream stayed busy) is ended, and Reload returns by then whatever the
// number of such sessions. Reloads running at once deliver their policies in the order
// the daemon loaded them: an older one never replaces a newer one. The daemon calls it
// after a successful reload.
func (s *Server) Reload() {
	p, gen := s.policy()
	ss := s.live()
	deadline := time.Now().Add(policySendTimeout)
	for _, se := range ss {
		se.want(p, gen, deadline)
	}
	// The writes end at the deadline; a little more lets their errors arrive. A send
	// still waiting then is one stuck behind another write on the control stream.
	by := deadline.Add(100 * time.Millisecond)
	for _, se := range ss {
		// A session that ended instead (its write failed) was logged by its writer.
		if err := se.waitSent(gen, by); errors.Is(err, errNotTaken) {
			s.o.Log.Warn("attach: the session did not take the reloaded policy in time; ending it", "session", se.id, "timeout", policySendTimeout)
			// Closing the session fails the write the writer waits in.
			se.mux.Close()
		}
	}
}

func (s *Server) live() []*session {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := make([]*session, 0, len(s.sessions))
	for _, se := range s.sessions {
		if !se.mux.IsClosed() {
			ss = append(ss, se)
		}
	}
	sort.Slice(ss, func(i, j int) bool { return ss[i].started.After(ss[j].started) })
	return ss
}

// pick returns the newest live session that may carry w's flows.
func (s *Server) pick(w *api.Workload) *session {
	for _, se := range s.live() {
		if se.scope.allows(w) {
			return se
		}
	}
	return nil
}

// Live reports whether a session that may carry w's flows is up.
func (s *Server) Live(w *api.Workload) bool { return s.pick(w) != nil }

// Sessions lists the live sessions, newest first.
func (s *Server) Sessions() []SessionInfo {
	var out []SessionInfo
	for _, se := range s.live() {
		out = append(out, SessionInfo{ID: se.id, Credential: se.cred, Client: se.client, Remote: se.remote, Scope: se.scope.String(),
			Since: se.started, Policy: se.sentHash(), Flows: se.flows.Load(), Refused: se.refused.Load()})
	}
	return out
}

// Dial carries one flow of workload w over the newest live session allowed to carry it.
// f is the flow as the relay decided it (labels, image, process, host, destination,
// source, timestamp and id) and d that decision, taken under the live policy; with d
// nil, Dial decides f itself with the live policy (filling At and ID when zero). A flow
// whose decision is not `client`, a workload with no live session, or a refusal by the
// attach side is an error: the caller resets the workload's connection and never tries
// another exit. The relay's exit (Exit) also names the policy that took d.
func (s *Server) Dial(ctx context.Context, w *api.Workload, f rules.Flow, d *rules.Decision) (net.Conn, error) {
	return s.dial(ctx, w, f, d, nil)
}

// dial is Dial; by, when not nil, is the policy that took d, which the header names
// (the attach side decides again under it) whatever policy is live by now.
func (s *Server) dial(ctx context.Context, w *api.Workload, f rules.Flow, d *rules.Decision, by *rules.Policy) (net.Conn, error) {
	p, gen := s.policy()
	se := s.pick(w)
	if se != nil {
		// The session is queued the live policy if a reload has not queued it yet, and
		// the header names the newest policy the session was given (p, unless a reload
		// queued a newer one since p was read). The flow does not wait for the write: the
		// attach side waits a moment for a policy a header names that it does not hold.
		p = se.want(p, gen, time.Now().Add(policySendTimeout))
	}
	if d != nil && by != nil {
		// A reload between the relay's decision and this dial must not have the attach
		// side decide under the newer policy: the header names the one that decided,
		// queued for the session as an earlier policy if it does not hold it.
		p = by
		if se != nil {
			se.hold(by, time.Now().Add(policySendTimeout))
		}
	}
	if f.At.IsZero() {
		f.At = time.Now()
	}
	if f.ID == 0 {
		f.ID = s.seq.Add(1) | 1<<63
	}
	if d == nil {
		dd := p.Decide(&f)
		d = &dd
	}
	fail := func(err error) (net.Conn, error) {
		if s.o.Audit != nil {
			s.o.Audit.Add(audit.Record{At: f.At, Rule: d.Rule, Priority: d.Priority, Dimension: d.Dimension.String(),
				Exit: rules.ExitClient, Note: d.Note, Reason: err.Error(), Path: "relay"})
		}
		s.o.Log.Info("client flow refused", "workload", w.ID, "flow", f.ID, "reason", err.Error())
		return nil, &net.OpError{Op: "attach", Net: "tcp", Err: err}
	}
	if d.Exit != rules.ExitClient {
		return fail(ErrNotClient)
	}
	if se == nil {
		return fail(ErrNoSession)
	}
	if !se.reserve(f.ID) {
		return fail(fmt.Errorf("%w (flow %d)", ErrDuplicateFlow, f.ID))
	}
	carried := false
	defer func() {
		if !carried {
			se.release(f.ID, nil)
		}
	}()
	se.flows.Add(1)
	st, err := se.mux.OpenStream()
	if err != nil {
		return fail(fmt.Errorf("%w (opening a stream: %v)", ErrNoSession, err))
	}
	// Watched before the header goes: the attach side's FIN may follow its verdict at once.
	fin := se.fins.add(st.StreamID())
	defer func() {
		if !carried {
			se.fins.remove(st.StreamID())
		}
	}()
	port := f.Dst.Port()
	dst := f.Dst
	if !dst.Addr().IsValid() {
		dst = netip.AddrPort{}
	}
	h := Header{Flow: f.ID, At: f.At, Workload: w.ID, Namespace: w.Namespace, Name: w.Name, Labels: f.Labels, Image: f.Image,
		Process: f.Process, Host: f.Host, Dst: dst, Port: port, Src: f.Src, Policy: p.Hash(), Exit: d.Exit, Proxy: d.Proxy}
	if dl, ok := ctx.Deadline(); ok {
		st.SetDeadline(dl)
	} else {
		st.SetDeadline(time.Now().Add(s.o.HandshakeTimeout))
	}
	if err := writeFrame(st, h); err != nil {
		st.Close()
		return fail(fmt.Errorf("%w (writing the header: %v)", ErrNoSession, err))
	}
	br := bufio.NewReaderSize(st, 512)
	var v Verdict
	if err := readFrame(br, maxSmallFrame, &v); err != nil {
		st.Close()
		// The attach side may still be dialling, and would carry the flow once it
		// succeeds, into a stream no one reads: tell it to drop the flow.
		se.abort(f.ID)
		if ctx.Err() != nil {
			return fail(fmt.Errorf("attach side did not answer: %w", ctx.Err()))
		}
		return fail(fmt.Errorf("attach side did not answer: %v", err))
	}
	if !v.OK {
		se.refused.Add(1)
		st.Close()
		return fail(refusal(v))
	}
	st.SetDeadline(time.Time{})
	carried = true
	if br.Buffered() > 0 {
		// The attach side sends nothing after its verdict until the flow's own bytes, which
		// the reader may already hold: keep them.
		return se.track(&flowConn{Stream: st, pre: br, se: se, id: f.ID, fin: fin}), nil
	}
	return se.track(&flowConn{Stream: st, se: se, id: f.ID, fin: fin}), nil
}

// flowConn is a flow stream as a net.Conn for the relay's copy: half-close is the
// stream's Close, and a read deadline passing reads as os.ErrDeadlineExceeded like a
// socket's (yamux has its own error). A stream that ends without the attach side's
// half-close (the session died under it, or yamux gave up waiting for that half-close)
// fails with ECONNRESET, as writes do once the session is gone: the relay resets the
// workload's connection, so a cut transfer never looks complete.
type flowConn struct {
	*yamux.Stream
	pre *bufio.Reader
	se  *session
	id  uint64
	fin *atomic.Bool // the attach side half-closed the stream (finWatch)

	readEOF, wroteEOF, peerReset atomic.Bool
	closeOnce                    sync.Once
}

// SetReadDeadline keeps a reset flow's deadline in the past, whatever the copy sets.
func (c *flowConn) SetReadDeadline(t time.Time) error {
	if c.peerReset.Load() {
		t = time.Now()
	}
	return c.Stream.SetReadDeadline(t)
}

func (c *flowConn) Read(b []byte) (int, error) {
	if c.peerReset.Load() {
		return 0, &net.OpError{Op: "read", Net: "attach", Err: syscall.ECONNRESET}
	}
	var n int
	var err error
	if c.pre != nil && c.pre.Buffered() > 0 {
		n, err = c.pre.Read(b)
	} else {
		n, err = c.Stream.Read(b)
	}
	if err == io.EOF && !c.fin.Load() {
		return n, &net.OpError{Op: "read", Net: "attach", Err: syscall.ECONNRESET}
	}
	if err == io.EOF {
		c.readEOF.Store(true)
	}
	if err != nil && c.peerReset.Load() {
		return n, &net.OpError{Op: "read", Net: "attach", Err: syscall.ECONNRESET}
	}
	return n, deadlineErr(err)
}

func (c *flowConn) Write(b []byte) (int, error) {
	n, err := c.Stream.Write(b)
	if err != nil && (c.se.mux.IsClosed() || errors.Is(err, yamux.ErrConnectionReset)) {
		return n, &net.OpError{Op: "write", Net: "attach", Err: syscall.ECONNRESET}
	}
	return n, err
}

// ReadFrom copies from the workload's connection in large chunks: every Write to a
// stream is one frame that waits for the session to send it, so bigger writes amortise
// that round trip (the relay's copy finds this through the connection's WriteTo).
func (c *flowConn) ReadFrom(r io.Reader) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	return io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{r}, *bp)
}

// CloseWrite passes the workload's end of stream on (a half-close).
func (c *flowConn) CloseWrite() error {
	c.wroteEOF.Store(true)
	return c.Stream.Close()
}

// Close ends the flow. Unless both directions ended cleanly, the attach side is told to
// abort it, so it stops reading from the destination.
func (c *flowConn) Close() error {
	c.closeOnce.Do(func() {
		if !c.readEOF.Load() || !c.wroteEOF.Load() {
			c.se.abort(c.id)
		}
		c.se.release(c.id, c)
		c.se.fins.remove(c.Stream.StreamID())
	})
	return c.Stream.Close()
}

func deadlineErr(err error) error {
	var ne net.Error
	if err != nil && errors.As(err, &ne) && ne.Timeout() {
		return os.ErrDeadlineExceeded
	}
	return err
}
