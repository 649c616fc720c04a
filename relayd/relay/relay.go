// Package relay is the data path of kl-relayd: for every registered workload it holds a
// listener opened inside the workload's network namespace on the redirect port, and for
// every captured connection it recovers the original destination, asks the live policy
// for one decision and carries the bytes to the chosen exit (or resets the connection).
// Transparent flows are carried by event-loop threads (loop_linux.go); the rest, and the
// flows a loop hands over, by goroutines (carry, pipe.go).
//
// It is not the registration API or its persistence (package daemon, package registry).
// Sockets in pod namespaces come from package netns, which also moves an event loop's
// thread into a pod's netns (Handle.EnterLocked).
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/relayd/metrics"
	"github.com/kl-egress/kl/relayd/sniff"
	"github.com/kl-egress/kl/relayd/sockowner"
	"github.com/kl-egress/kl/relayd/upstream"
	"github.com/kl-egress/kl/rules"
)

// Decider is the live rule set; *rules.Policy implements it. A Decider that also has
// NeedsHost() bool gets the hostname of transparent flows (peeked from a TLS ClientHello
// or an HTTP request) when it says it needs it.
type Decider interface {
	Decide(f *rules.Flow) rules.Decision
}

type hostNeeder interface{ NeedsHost() bool }

// A Decider that also has NeedsProcess() bool gets the connecting process when it says
// it needs it.
type processNeeder interface{ NeedsProcess() bool }

// addrNeeder is a Decider that says whether a hostname-only flow's decision could depend
// on the address the name resolves to (*rules.Policy: cidr rules, the pattern form, or
// a gateway the metadata guard must check first).
type addrNeeder interface{ NeedsAddr() bool }

// OwnerFinder finds the process behind a connection (*sockowner.Finder).
type OwnerFinder interface {
	Lookup(k sockowner.Key) (rules.Process, error)
	Forget(k sockowner.Key)
}

// Dest is where an exit takes a flow.
type Dest struct {
	Addr netip.AddrPort // the address the policy checked; invalid when only Host is known (proxy mode)
	// Host is the hostname for the exit to dial (and resolve on its side) instead of
	// Addr. It is set only when the decision rested on the name, or when no address is
	// known and none could have changed the decision (NameDecided, proxyDial); otherwise
	// it is "", also when the flow carried a name.
	Host string
	Port uint16 // the destination port (always set)
}

// DialFunc connects a flow of workload w to dst through one exit. The returned
// connection should be a *net.TCPConn (or wrap one) for the copy to use splice.
type DialFunc func(ctx context.Context, w *api.Workload, dst Dest) (net.Conn, error)

// Options configure a Relay. Policy and Log are required.
type Options struct {
	RedirectPort   uint16
	HTTPPort       uint16        // proxy mode: HTTP proxy on the pod's loopback
	SOCKSPort      uint16        // proxy mode: SOCKS5 proxy on the pod's loopback
	Mark           uint32        // SO_MARK of the relay's dial sockets
	IdleTimeout    time.Duration // default 10m
	ConnectTimeout time.Duration // default 10s
	Debug          bool          // log destinations (SPEC §5: never by default)
	SniffWait      time.Duration // bound on peeking a transparent flow's hostname (default 200ms)
	SniffSkipPorts []uint16      // destination ports never peeked
	// Loops is the number of event-loop threads that carry transparent flows (0: one per
	// two CPUs, at least one; below 0: none, every flow on goroutines).
	Loops  int
	Policy func() Decider
	// Exits carries flows whose decision is not direct or deny, by exit name. An exit
	// with no entry is refused (reset) with a logged reason.
	Exits map[string]DialFunc
	// Upstreams are the exits of Exits that are upstream proxies. An event loop carries a
	// flow to one at a literal address itself (connect and handshake included); other
	// flows through them, and every flow on goroutines, go through Exits.
	Upstreams map[string]upstream.Handshaker
	Log       *slog.Logger
	// Audit receives one record per decision (nil: none).
	Audit *audit.Log
	// Metrics counts decisions, dials, active flows and bytes (nil: none).
	Metrics *metrics.Metrics
	// Owners finds a connection's process for policies with process rules (default
	// sockowner.New(): sock_diag in the pod netns, then /proc).
	Owners OwnerFinder

	// listen, dial and origDst are test seams (netns.Listen, netns.Dial, netns.OriginalDst).
	listen  func(nsPath, network, addr string) (net.Listener, error)
	dial    func(ctx context.Context, nsPath string, mark uint32, network, addr string) (net.Conn, error)
	origDst func(c *net.TCPConn) (netip.AddrPort, error)
	resolve func(ctx context.Context, host string) ([]netip.Addr, error)
}

// Relay serves the workloads' listeners. Its methods are safe for concurrent use; the
// caller serialises Open and Close for one id.
type Relay struct {
	o Options
	// handles: each pod holds its netns open (netns.Handle) for its listeners and dials
	// (false when a test replaced listen or dial).
	handles bool

	mu   sync.Mutex
	pods map[string]*pod
	shut bool

	flowWG  sync.WaitGroup
	flowSeq atomic.Uint64
	active  atomic.Int64
	total   atomic.Uint64

	exitMu sync.Mutex
	byExit map[string]uint64

	loops     []*loop                 // started on first use (loopFor)
	upstreams map[string]loopUpstream // Options.Upstreams the loops dial themselves
}

type pod struct {
	w      atomic.Pointer[registered]
	ns     *netns.Handle // the workload's netns, held open while served (nil without handles)
	lns    []net.Listener
	ls     api.Listeners
	cancel context.CancelFunc // stops the proxy servers
	serve  sync.WaitGroup     // accept loops
	l      *loop              // the event loop serving a transparent pod (nil: goroutines)
	lp     *lpod

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// registered is a workload as flows read it: the label keys are listed once, so that
// a decision need not range over the label map (rules.Flow.LabelKeys).
type registered struct {
	api.Workload
	labelKeys []string
}

func newRegistered(w api.Workload) *registered {
	return &registered{Workload: w, labelKeys: rules.KeysOf(w.Labels)}
}

// loopUpstream is an upstream exit an event loop dials itself: its address is literal.
type loopUpstream struct {
	addr netip.AddrPort
	hs   upstream.Handshaker
}

// loopUpstreams picks the upstreams of o at a literal address.
func loopUpstreams(o *Options) map[string]loopUpstream {
	m := map[string]loopUpstream{}
	for name, hs := range o.Upstreams {
		if ap, err := netip.ParseAddrPort(hs.Addr()); err == nil && o.Exits[name] != nil {
			m[name] = loopUpstream{netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), hs}
		}
	}
	return m
}

// ErrClosed is returned by Open after Shutdown.
var ErrClosed = errors.New("relay is shut down")

// New returns a Relay with no workloads.
func New(o Options) *Relay {
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 10 * time.Minute
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	if o.RedirectPort == 0 {
		o.RedirectPort = api.DefaultRedirectPort
	}
	if o.HTTPPort == 0 {
		o.HTTPPort = api.DefaultHTTPPort
	}
	if o.SOCKSPort == 0 {
		o.SOCKSPort = api.DefaultSOCKSPort
	}
	handles := o.listen == nil && o.dial == nil
	if o.listen == nil {
		o.listen = netns.Listen
	}
	if o.dial == nil {
		o.dial = netns.Dial
	}
	if o.resolve == nil {
		o.resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	if o.origDst == nil {
		o.origDst = netns.OriginalDst
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Owners == nil {
		o.Owners = sockowner.New()
	}
	if o.SniffWait <= 0 {
		o.SniffWait = 200 * time.Millisecond
	}
	if o.Loops == 0 {
		o.Loops = max(1, runtime.NumCPU()/2)
	}
	return &Relay{o: o, handles: handles, pods: map[string]*pod{}, byExit: map[string]uint64{}, upstreams: loopUpstreams(&o)}
}

// Open starts serving workload w. Transparent mode: a listener on the redirect port inside
// w.Netns (one dual-stack socket; IPv4-only when the netns has no IPv6). Proxy mode: an
// HTTP and a SOCKS5 proxy on the pod's loopback (127.0.0.1). When Open returns, the
// listeners exist and accept. Opening an id that is already open with the same netns
// path only refreshes its metadata (labels, image); see Refresh for the same netns under
// another path.
func (r *Relay) Open(w api.Workload) (api.Listeners, error) {
	switch w.Mode {
	case api.ModeTransparent, api.ModeProxy:
	default:
		return api.Listeners{}, fmt.Errorf("workload %s: mode %q has no relay listeners", w.ID, w.Mode)
	}
	if ls, ok, err := r.refresh(w, false); ok || err != nil {
		return ls, err
	}
	// A different netns or mode under a known id: the sandbox was recreated.
	r.Close(w.ID)

	p := &pod{conns: map[net.Conn]struct{}{}}
	p.w.Store(newRegistered(w))
	if r.handles {
		h, err := netns.Open(w.Netns)
		if err != nil {
			return api.Listeners{}, fmt.Errorf("workload %s: %w", w.ID, err)
		}
		p.ns = h
	}
	var err error
	if w.Mode == api.ModeTransparent {
		err = r.openTransparent(p, w)
	} else {
		err = r.openProxy(p, w)
	}
	if err != nil {
		p.closeNetns()
		return api.Listeners{}, fmt.Errorf("workload %s: %w", w.ID, err)
	}
	r.mu.Lock()
	if r.shut {
		r.mu.Unlock()
		p.stop()
		return api.Listeners{}, ErrClosed
	}
	r.pods[w.ID] = p
	r.mu.Unlock()
	return p.ls, nil
}

// Refresh is Open for an id already open in the same mode whose netns the caller has
// checked is the same namespace (device and inode), also under another path (containers
// sharing a netns: it is re-registered through a member still running when the first
// goes): the listeners and the flows they carry stay, and flows from now on read w (its
// path, labels, image). The netns is held open by the relay, so the old path may be gone.
// It reports false, changing nothing, when the id is not open or is open in another
// mode, or when the relay is shut down; the caller then Opens. The caller
// serialises it with Open and Close for one id.
func (r *Relay) Refresh(w api.Workload) (api.Listeners, bool) {
	ls, ok, _ := r.refresh(w, true)
	return ls, ok
}

// refresh replaces the workload of open id w.ID, if it is open in w's mode and at w's
// netns path, or (anyPath) at another path (of the same netns: the caller checks).
func (r *Relay) refresh(w api.Workload, anyPath bool) (api.Listeners, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shut {
		return api.Listeners{}, false, ErrClosed
	}
	p, ok := r.pods[w.ID]
	if !ok {
		return api.Listeners{}, false, nil
	}
	if old := p.w.Load(); old.Mode != w.Mode || old.Netns != w.Netns && !anyPath {
		return api.Listeners{}, false, nil
	}
	p.w.Store(newRegistered(w))
	return p.ls, true, nil
}

func (r *Relay) openTransparent(p *pod, w api.Workload) error {
	p.ls = api.Listeners{Redirect: r.o.RedirectPort}
	if ok, err := r.openOnLoop(p); ok || err != nil {
		return err
	}
	addr := fmt.Sprintf(":%d", r.o.RedirectPort)
	ln, err := r.listenIn(p, w.Netns, "tcp", addr)
	if err != nil {
		// A netns without IPv6 cannot hold a dual-stack socket.
		ln4, err4 := r.listenIn(p, w.Netns, "tcp4", addr)
		if err4 != nil {
			return errors.Join(err, err4)
		}
		ln = ln4
	}
	p.lns = []net.Listener{ln}
	p.serve.Add(1)
	go func() {
		defer p.serve.Done()
		r.serve(p, ln)
	}()
	return nil
}

// stop closes the listeners and waits for the accept loops, then closes every flow.
func (p *pod) stop() {
	p.closeListeners()
	p.closeConns()
	p.closeNetns()
}

// closeListeners stops accepting new flows and waits for the accept loops to end.
func (p *pod) closeListeners() {
	if p.cancel != nil {
		p.cancel()
	}
	for _, ln := range p.lns {
		ln.Close()
	}
	p.closeLoopListener()
	p.serve.Wait()
}

// closeNetns releases the pod's netns handle (a dial in progress finishes first).
func (p *pod) closeNetns() {
	if p.ns != nil {
		_ = p.ns.Close()
	}
}

// listenIn listens inside the pod's netns (at nsPath).
func (r *Relay) listenIn(p *pod, nsPath, network, addr string) (net.Listener, error) {
	if p.ns != nil {
		return p.ns.Listen(network, addr)
	}
	return r.o.listen(nsPath, network, addr)
}

// dialIn dials from the pod's netns (at nsPath) with the relay's mark.
func (r *Relay) dialIn(ctx context.Context, p *pod, nsPath, addr string) (net.Conn, error) {
	if p.ns != nil {
		return p.ns.Dial(ctx, r.o.Mark, "tcp", addr)
	}
	return r.o.dial(ctx, nsPath, r.o.Mark, "tcp", addr)
}

// dialAddrIn is dialIn for an address already known (no text to parse).
func (r *Relay) dialAddrIn(ctx context.Context, p *pod, nsPath string, ap netip.AddrPort) (net.Conn, error) {
	if p.ns != nil {
		return p.ns.DialAddrPort(ctx, r.o.Mark, ap)
	}
	return r.o.dial(ctx, nsPath, r.o.Mark, "tcp", ap.String())
}

// Close stops serving a workload: its listener and every flow it carries are closed (the
// netns is going away). It reports whether the id was open.
func (r *Relay) Close(id string) bool {
	r.mu.Lock()
	p, ok := r.pods[id]
	delete(r.pods, id)
	r.mu.Unlock()
	if !ok {
		return false
	}
	p.stop()
	return true
}

// Serving says whether id has listeners open.
func (r *Relay) Serving(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.pods[id]
	return ok
}

// IDs returns the ids being served.
func (r *Relay) IDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.pods))
	for id := range r.pods {
		ids = append(ids, id)
	}
	return ids
}

// Len is the number of workloads being served.
func (r *Relay) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pods)
}

// Stats counts flows.
func (r *Relay) Stats() api.FlowStats {
	s := api.FlowStats{Active: r.active.Load(), Total: r.total.Load(), ByExit: map[string]uint64{}}
	r.exitMu.Lock()
	for k, v := range r.byExit {
		s.ByExit[k] = v
	}
	r.exitMu.Unlock()
	return s
}

// Shutdown stops accepting on every listener, lets established flows finish until ctx
// is done, then closes them. Proxy-mode flows (tunnels, forwarded requests) drain as
// transparent ones do; a request that reaches a proxy once the drain has begun is
// refused. An HTTP proxy client kept alive between requests is closed, with its kept
// origin connection, as the drain begins (once its answer is out, for one in the middle
// of an exchange); another proxy client connection that carries no flow is closed when
// the drain is over.
func (r *Relay) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	r.shut = true
	pods := r.pods
	r.pods = map[string]*pod{}
	r.mu.Unlock()
	for _, p := range pods {
		p.closeListeners()
	}
	defer r.stopLoops()
	drained := make(chan struct{})
	go func() { r.flowWG.Wait(); close(drained) }()
	select {
	case <-drained:
		for _, p := range pods {
			p.closeConns() // only proxy clients between requests are left
			p.closeNetns()
		}
		return nil
	case <-ctx.Done():
	}
	for _, p := range pods {
		p.closeConns()
	}
	<-drained
	for _, p := range pods {
		p.closeNetns()
	}
	return ctx.Err()
}

func (r *Relay) serve(p *pod, ln net.Listener) {
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors or a transient error: back off, keep the listener.
			if delay == 0 {
				delay = 5 * time.Millisecond
			} else if delay < time.Second {
				delay *= 2
			}
			r.o.Log.Warn("accept failed", "workload", p.w.Load().ID, "err", err, "retry", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		tc, ok := c.(*net.TCPConn)
		if !ok || !p.track(c) {
			c.Close()
			continue
		}
		r.begin()
		go r.flow(p, tc)
	}
}

func (p *pod) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *pod) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *pod) closeConns() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		setLinger0(c) // cut: the workload sees a reset, not a clean end of stream
		c.Close()
	}
	p.closeLoopFlows()
}

func (r *Relay) count(exit string) {
	r.exitMu.Lock()
	r.byExit[exit]++
	r.exitMu.Unlock()
}

// reset aborts a connection with a TCP RST, so the client sees a refusal rather than a
// clean end of stream.
func reset(c *net.TCPConn) {
	_ = c.SetLinger(0)
	c.Close()
}

func addrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// begin counts a flow in (at its accept); end counts it out once its connections are
// closed.
func (r *Relay) begin() {
	r.active.Add(1)
	r.total.Add(1)
	r.flowWG.Add(1)
}

func (r *Relay) end() {
	r.active.Add(-1)
	r.flowWG.Done()
}

// join counts a proxy-mode flow into Shutdown's drain (flowWG), as begin does a
// transparent flow at its accept, and reports true; once Shutdown has begun it counts
// nothing and reports false. A proxy takes requests on connections it accepted before
// Shutdown closed its listener, so a flow can start while Shutdown waits, unlike a
// transparent one: under mu, no flow joins a drain that may already be over (and a
// WaitGroup must not gain from zero while it is waited on).
func (r *Relay) join() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shut {
		return false
	}
	r.flowWG.Add(1)
	return true
}

// flow decides one accepted connection and dials its exit; the bytes are then carried by
// two copy goroutines (pipeAsync) and this goroutine ends.
func (r *Relay) flow(p *pod, c *net.TCPConn) {
	w := p.w.Load()
	id := r.flowSeq.Add(1)
	dst, err := r.o.origDst(c)
	if err == nil {
		dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
		err = r.admit(dst, addrPort(c.LocalAddr()))
	}
	if err != nil {
		r.refuse(w.ID, id, err)
		reset(c)
		p.untrack(c)
		r.end()
		return
	}
	r.carry(p, c, w, r.newFlow(w, dst, addrPort(c.RemoteAddr()), id), r.o.Policy(), nil)
}

// errCut is why a flow decided but not yet carried was not: its pod went away or the
// relay shut down before its exit answered (on goroutines: while the exit's dial was
// under way, whose connection is then closed unused).
var errCut = errors.New("closed by the relay before the exit answered")

// errSelf refuses a connection made straight to the relay port.
var errSelf = errors.New("connection to the relay port itself")

// admit checks a captured connection's original destination against the listener's own
// address (local). A connection made straight to the relay port, not redirected to it
// (the capture redirects to the pod's loopback; anything else came from outside the pod,
// for example through a Service aimed at this port), is refused: carrying it "direct"
// would make the relay an open proxy, or connect to itself forever.
func (r *Relay) admit(dst, local netip.AddrPort) error {
	if dst == local || !local.Addr().IsLoopback() {
		return errSelf
	}
	return nil
}

// refuse counts and logs a flow refused before any decision.
func (r *Relay) refuse(wid string, id uint64, err error) {
	r.count("refused")
	if errors.Is(err, errSelf) {
		r.o.Log.Warn("flow refused: connection to the relay port itself", "workload", wid, "flow", id)
		return
	}
	r.o.Log.Warn("flow refused: no original destination", "workload", wid, "flow", id, "err", r.redact(err))
}

func (r *Relay) newFlow(w *registered, dst, src netip.AddrPort, id uint64) rules.Flow {
	return rules.Flow{Labels: w.Labels, LabelKeys: w.labelKeys, Image: w.Image, Dst: dst, Src: src.Addr(), At: time.Now(), ID: id}
}

// wantsHost reports whether pol decides a flow to port only once it knows the flow's
// hostname (peeked); wantsProcess whether it needs its process (looked up).
func (r *Relay) wantsHost(pol Decider, port uint16) bool {
	hn, ok := pol.(hostNeeder)
	return ok && hn.NeedsHost() && !slices.Contains(r.o.SniffSkipPorts, port)
}

func wantsProcess(pol Decider) bool {
	pn, ok := pol.(processNeeder)
	return ok && pn.NeedsProcess()
}

// carry learns what the policy needs to know of flow f (its hostname, its process),
// decides it unless decided is given, and carries it to its exit. It owns c and counts
// the flow out when it does not carry it.
func (r *Relay) carry(p *pod, c *net.TCPConn, w *registered, f rules.Flow, pol Decider, decided *rules.Decision) {
	carried := false
	defer func() {
		if !carried {
			p.untrack(c)
			r.end()
		}
	}()
	log := r.o.Log
	var d rules.Decision
	if decided != nil {
		d = *decided
	} else {
		if r.wantsHost(pol, f.Dst.Port()) {
			// The peek consumes nothing: the bytes still reach the destination.
			host, err := sniff.Host(c, r.o.SniffWait)
			if err != nil {
				r.peekFailed(w.ID, &f, err)
				reset(c)
				return
			}
			f.Host = host
		}
		if wantsProcess(pol) {
			k := sockowner.Key{Netns: w.Netns, Src: addrPort(c.RemoteAddr()), Dst: f.Dst}
			f.Process = r.owner(k, w.ID, f.ID)
			defer r.o.Owners.Forget(k)
		}
		d = r.decide(pol, &f, w.ID)
	}

	var dial DialFunc
	switch d.Exit {
	case rules.ExitDeny:
		r.deny(d, &f)
		reset(c)
		return
	case rules.ExitDirect:
		dial = func(ctx context.Context, w *api.Workload, dst Dest) (net.Conn, error) {
			return r.dialAddrIn(ctx, p, w.Netns, dst.Addr)
		}
	default:
		if decided == nil {
			r.keepHostIfDecided(pol, &f, d) // (a loop that decided has done so)
		}
		if dial = r.o.Exits[d.Exit]; dial == nil {
			r.unavailable(d, &f, w.ID)
			reset(c)
			return
		}
	}
	r.count(d.Exit)
	ctx, cancel := context.WithTimeout(context.Background(), r.o.ConnectTimeout)
	dialStart := time.Now()
	up, err := dial(withDecision(ctx, &f, &d, pol, p.ns), &w.Workload, Dest{Addr: f.Dst, Host: f.Host, Port: f.Dst.Port()})
	cancel()
	r.o.Metrics.Dialed(d.Exit, time.Since(dialStart), err)
	if err != nil {
		r.unreachable(d, &f, w.ID, err)
		reset(c)
		return
	}
	// Tracked before the record: a pod closed while the exit was being dialed has already
	// reset the workload's connection, and the record must say the flow was cut, not
	// carried.
	if !p.track(up) {
		up.Close()
		reset(c)
		r.record(d, &f, errCut.Error())
		return
	}
	r.record(d, &f, "")
	done := r.o.Metrics.Start(d.Exit)
	carried = true
	debug, wid, id := r.o.Debug, w.ID, f.ID
	r.pipeAsync(c, up, func(upBytes, downBytes int64, err error) {
		done(upBytes, downBytes)
		if err != nil && debug {
			log.Debug("flow ended", "workload", wid, "flow", id, "err", err)
		}
		p.untrack(up)
		p.untrack(c)
		r.end()
	})
}

// decide takes the policy's decision for f and counts it.
func (r *Relay) decide(pol Decider, f *rules.Flow, wid string) rules.Decision {
	d := pol.Decide(f)
	r.o.Metrics.Decided(d.Exit, d.Dimension.String(), d.Rule, time.Since(f.At))
	if r.o.Debug {
		r.o.Log.Debug("decision", "workload", wid, "flow", f.ID, "dst", f.Dst, "host", f.Host, "exit", d.Exit, "rule", d.Rule, "dimension", d.Dimension.String())
	}
	return d
}

// keepHostIfDecided clears f.Host unless the name decided d (NameDecided): the exit goes
// to the address that was checked, the one the workload connected to; the name is the
// client's word (SNI, Host), not where it goes. From here f is the flow as the exit sees
// it (FlowFrom).
func (r *Relay) keepHostIfDecided(pol Decider, f *rules.Flow, d rules.Decision) {
	if !NameDecided(pol, f, d) {
		f.Host = ""
	}
}

// peekFailed counts and logs a flow whose socket failed while its hostname was peeked,
// or that names a host that cannot be read (the caller resets it). The latter is a
// decision: refused rather than decided without its name (a domain rule could not see
// it), it is counted and recorded as a deny of the domain dimension and tier, rule 0,
// with the reason.
func (r *Relay) peekFailed(wid string, f *rules.Flow, err error) {
	r.o.Log.Info("flow failed: peek for the hostname", "workload", wid, "flow", f.ID, "err", r.redact(err))
	if !errors.Is(err, sniff.ErrMalformed) {
		r.count("refused")
		return
	}
	d := rules.Decision{Exit: rules.ExitDeny, Priority: rules.PriorityDomain, Dimension: rules.DimDomain}
	r.o.Metrics.Decided(d.Exit, d.Dimension.String(), d.Rule, time.Since(f.At))
	r.count(d.Exit)
	r.record(d, f, "refused: "+audit.Reason(err))
}

// deny counts and records a denied flow (the caller resets it).
func (r *Relay) deny(d rules.Decision, f *rules.Flow) {
	r.count(rules.ExitDeny)
	r.record(d, f, "")
}

// unavailable counts, logs and records a flow whose exit this relay does not have.
func (r *Relay) unavailable(d rules.Decision, f *rules.Flow, wid string) {
	r.count("refused")
	r.o.Log.Warn("flow refused: exit not available in this relay", "workload", wid, "flow", f.ID, "exit", d.Exit, "rule", d.Rule, "dimension", d.Dimension.String())
	r.record(d, f, "exit "+d.Exit+" is not available in this relay")
}

// unreachable logs and records a flow whose exit could not be reached.
func (r *Relay) unreachable(d rules.Decision, f *rules.Flow, wid string, err error) {
	r.o.Log.Info("flow failed: exit unreachable", "workload", wid, "flow", f.ID, "exit", d.Exit, "err", r.redact(err))
	r.record(d, f, audit.Reason(err))
}

// NameDecided reports whether decision d for flow f rested on f's hostname, so that an
// exit may be handed the name (an upstream, the gateway or the attach side then resolves
// it on its own side) rather than the address the policy checked: a domain rule matched
// the name, a pattern rule's HOST is a host glob (not `*`, an address or a prefix), or a
// script answers otherwise for the same flow without its name (it looked at the name,
// not only at the address dnsResolve gives it).
//
// The name is the client's own word (TLS SNI, HTTP Host, the CONNECT target). Handing it
// over in any other case would let a workload send a flow the policy decided for one
// address to whatever the name resolves to on the far side: with `cidr: 127.0.0.0/8,
// action: proxy`, a connection to 127.0.0.1 saying `Host: anything` would be proxied to
// anything.
//
// That holds for the default too. The name matched no rule and neither did the address;
// but the address the far side would resolve the name to was never checked, and a cidr
// rule (or a prefix pattern) could have denied it or sent it elsewhere. What the far
// side's own resolution would buy (its DNS view, its choice among addresses) is given up
// for a flow that goes where it was checked to go. Label, image and process decisions
// do not depend on the destination, but when an address is known they get it as well:
// it is the destination the workload asked for.
//
// The attach side applies the same rule to its own decision (relayd/attach).
func NameDecided(pol Decider, f *rules.Flow, d rules.Decision) bool {
	if f.Host == "" {
		return false
	}
	switch d.Dimension {
	case rules.DimDomain:
		return true
	case rules.DimPattern:
		if nr, ok := pol.(nameRuler); ok && d.Rule > 0 {
			return nr.MatchesName(d.Rule)
		}
		fallthrough
	case rules.DimScript:
		g := *f
		g.Host = ""
		return pol.Decide(&g) != d
	}
	return false
}

// nameRuler is a Decider that says whether a rule matches on the hostname
// (*rules.Policy).
type nameRuler interface{ MatchesName(i int) bool }

// owner looks up the process behind connection k. A failure is an explicit unknown
// (process rules do not match it), logged at debug level.
func (r *Relay) owner(k sockowner.Key, workload string, flow uint64) rules.Process {
	p, err := r.o.Owners.Lookup(k)
	if err != nil {
		r.o.Log.Debug("process unknown", "workload", workload, "flow", flow, "err", r.redact(err))
		return rules.Process{}
	}
	return p
}

// redact keeps destinations out of the log unless debugging is on (SPEC §5): dial and
// socket errors name the address they failed on. It is the audit record's reason text
// (audit.Reason), which keeps the cause and the upstream's own address.
func (r *Relay) redact(err error) any {
	if r.o.Debug {
		return err
	}
	return audit.Reason(err)
}

// record writes the decision's audit record for flow f; reason says why the flow did not
// go out. The reason loses f's own host name and address (SPEC §5): a script's failure
// (d.Reason) may quote the url, host or address it was given, and audit.Reason cannot
// recognise a name, nor an address inside a URL.
func (r *Relay) record(d rules.Decision, f *rules.Flow, reason string) {
	if r.o.Audit == nil {
		return
	}
	if reason == "" {
		reason = d.Reason
	}
	r.o.Audit.Add(audit.Record{At: f.At, Rule: d.Rule, Priority: d.Priority, Dimension: d.Dimension.String(),
		Exit: d.Exit, Note: d.Note, Reason: withoutDestination(reason, f), Path: "relay"})
}

// withoutDestination replaces f's host name and address in s, in any letter case.
func withoutDestination(s string, f *rules.Flow) string {
	if s == "" {
		return s
	}
	if h := strings.TrimSuffix(f.Host, "."); h != "" {
		s = replaceFold(s, h, "<host>")
	}
	if a := f.Dst.Addr(); a.IsValid() {
		s = replaceFold(s, a.String(), "<address>")
	}
	return s
}

// replaceFold replaces every occurrence of old in s that is not part of a longer word
// (so that a one-label host "a" leaves the rest of the text alone), compared
// case-insensitively.
func replaceFold(s, old, repl string) string {
	var b strings.Builder
	last := 0
	for i := 0; i+len(old) <= len(s); {
		j := i + len(old)
		if strings.EqualFold(s[i:j], old) && (i == 0 || !isWordByte(s[i-1])) && (j == len(s) || !isWordByte(s[j])) {
			b.WriteString(s[last:i])
			b.WriteString(repl)
			i, last = j, j
			continue
		}
		i++
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

func isWordByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == '-'
}

type flowKey struct{}

type flowInfo struct {
	f   rules.Flow
	d   rules.Decision
	pol Decider // the policy that took d (nil: not known)
	ns  *netns.Handle
}

// withDecision gives an exit's dial what it may read (FlowFrom, PolicyFrom, NetnsFrom):
// flow f, decision d and pol, the policy that took d. The direct exit reads none of it,
// so its context is left as it is.
func withDecision(ctx context.Context, f *rules.Flow, d *rules.Decision, pol Decider, ns *netns.Handle) context.Context {
	if d.Exit == rules.ExitDirect {
		return ctx
	}
	return context.WithValue(ctx, flowKey{}, &flowInfo{*f, *d, pol, ns})
}

// NetnsFrom returns, inside an exit's DialFunc, the workload's netns as the relay holds it
// open (nil when it does not): an exit dials its upstream with it rather than by path.
func NetnsFrom(ctx context.Context) *netns.Handle {
	fi, ok := ctx.Value(flowKey{}).(*flowInfo)
	if !ok {
		return nil
	}
	return fi.ns
}

// PolicyFrom returns, inside an exit's DialFunc, the policy that took the decision
// FlowFrom returns (nil when the relay did not say): it may be older than the live one,
// when a reload landed between the decision and the dial, and a next hop that takes the
// same decision again must take it under this one.
func PolicyFrom(ctx context.Context) Decider {
	fi, ok := ctx.Value(flowKey{}).(*flowInfo)
	if !ok {
		return nil
	}
	return fi.pol
}

// FlowFrom returns, inside an exit's DialFunc, the flow the relay decided (with its
// timestamp and id) and the decision, so a next hop can take the same decision again
// (under PolicyFrom).
func FlowFrom(ctx context.Context) (rules.Flow, rules.Decision, bool) {
	fi, ok := ctx.Value(flowKey{}).(*flowInfo)
	if !ok {
		return rules.Flow{}, rules.Decision{}, false
	}
	return fi.f, fi.d, true
}
