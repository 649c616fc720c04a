package pac

import (
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dop251/goja"
	"github.com/dop251/goja/ast"
	"github.com/dop251/goja/parser"
)

// Script is a compiled PAC program with its pool of runtimes. It is safe for
// concurrent use. Its runtimes are released by Close, or when the Script is garbage.
type Script struct {
	p *pool
}

// pool is everything the worker goroutines share. Workers hold the pool, never the
// Script, so an unreachable Script can be cleaned up while idle workers wait.
type pool struct {
	name         string
	prog         *goja.Program
	deadline     time.Duration
	loc          *time.Location
	log          *slog.Logger
	maxAbandoned int64
	setupDelay   time.Duration // Options.setupDelay

	// inline: calls run on the caller's goroutine (classify proved the script
	// interruptible); otherwise each is handed to the runtime's own goroutine. why
	// says what keeps a script off the inline path.
	inline  bool
	why     string
	regexes []string // an inline script's regex literals (classify)

	needsAddr bool // Script.NeedsAddr

	// The script's global variables, top-level lexical names and the other global
	// properties it may add, and whether it can hold the global object as a value
	// (state.go).
	globals, lexicals, props []string
	globalValue              bool

	idle      chan *worker  // runtimes ready for a call
	slots     chan struct{} // one token per live (not abandoned) runtime
	abandoned atomic.Int64  // runtimes stuck past a deadline, still running
	closed    atomic.Bool

	// An inline pool's per-P cache of idle runtimes (local.go), and how many calls
	// wait for one.
	local   sync.Pool
	waiting atomic.Int32
	// handoffs counts inline calls that reached a guard and ran again handed off.
	handoffs atomic.Int64
}

// maxStack bounds JavaScript recursion (a runaway recursion is an exception, not a crash).
const maxStack = 1000

// recursionMsg says why a script that hit maxStack failed: goja's StackOverflowError
// prints only the stack, which names no cause.
var recursionMsg = fmt.Sprintf("recursion deeper than %d calls", maxStack)

// Compile checks and compiles a PAC script once: size bound, syntax, then its top-level
// code runs (within max(10*Deadline, 1s)) and must define a function FindProxyForURL.
// The error is a *CompileError.
func Compile(name, src string, o Options) (*Script, error) {
	return compile(name, src, o, true)
}

// compile is Compile; with allowInline false every script takes the hand-off path (the
// tests compare the two).
func compile(name, src string, o Options, allowInline bool) (*Script, error) {
	if len(src) > MaxScriptBytes {
		return nil, &CompileError{Code: CodeTooLarge, Msg: fmt.Sprintf("script is %d bytes, the bound is %d", len(src), MaxScriptBytes)}
	}
	c, err := compileProgram(name, src, allowInline)
	if err != nil {
		return nil, err
	}
	o = o.withDefaults()
	n := 2 * runtime.GOMAXPROCS(0)
	if n < 4 {
		n = 4
	}
	p := &pool{
		name:         name,
		prog:         c.prog,
		deadline:     o.Deadline,
		loc:          o.Location,
		log:          o.Log,
		maxAbandoned: int64(o.MaxAbandoned),
		setupDelay:   o.setupDelay,
		inline:       c.inline,
		why:          c.why,
		regexes:      c.regexes,
		needsAddr:    c.needsAddr,
		globals:      c.names.globals,
		lexicals:     c.names.lexicals,
		props:        c.names.props,
		globalValue:  c.names.globalValue,
		idle:         make(chan *worker, n),
		slots:        make(chan struct{}, n),
	}
	// The first runtime proves the script loads: its top-level code finishes within
	// setupLimit and FindProxyForURL is a function. Then the pool warms up to one
	// runtime per core in the background.
	p.slots <- struct{}{}
	w, err := p.start(p.setupLimit())
	if err != nil {
		return nil, err
	}
	p.idle <- w
	for i := 1; i < runtime.GOMAXPROCS(0); i++ {
		p.replace(true)
	}
	s := &Script{p: p}
	runtime.AddCleanup(s, func(p *pool) { p.close() }, p)
	return s, nil
}

// compiled is what compileProgram makes of a script.
type compiled struct {
	prog      *goja.Program
	inline    bool     // classify: the script may run inline
	why       string   // and if not, why
	regexes   []string // an inline script's regex literals
	names     stateNameLists
	needsAddr bool // Script.NeedsAddr
}

// compileProgram parses with goja's parser directly, because goja.Compile flattens
// syntax errors into a message without their position.
// It also refuses a script whose calls would keep state (checkState), lists the names
// sealing needs (stateNames), classifies the script for the inline path (classify) and
// finds whether it can reach the destination address (needsAddr).
func compileProgram(name, src string, allowInline bool) (*compiled, error) {
	if ce := checkNesting(name, src); ce != nil {
		return nil, ce
	}
	tree, err := parser.ParseFile(nil, name, src, 0)
	if err != nil {
		ce := &CompileError{Code: CodeScript, Msg: err.Error()}
		var el parser.ErrorList
		if errors.As(err, &el) && len(el) > 0 {
			ce.Line, ce.Column = el[0].Position.Line, el[0].Position.Column
			ce.Msg = el[0].Message + ce.at()
			switch n := len(el) - 1; {
			case n == 1:
				ce.Msg += " (and 1 more error)"
			case n > 1:
				ce.Msg += fmt.Sprintf(" (and %d more errors)", n)
			}
		}
		return nil, ce
	}
	if ce := checkDepth(tree); ce != nil {
		return nil, ce
	}
	if ce := checkState(tree); ce != nil {
		return nil, ce
	}
	c := &compiled{names: stateNames(tree), why: "the inline path is turned off"}
	c.needsAddr = needsAddr(tree, c.names.globalValue)
	var numeric func(ast.Expression) bool
	if allowInline {
		c.inline, c.why, c.regexes, numeric = classify(tree)
	}
	// After classify, which does not know the checks (and need not: they are O(1)).
	guardConcat(tree, numeric)
	c.prog, err = goja.CompileAST(tree, false)
	if err != nil {
		ce := &CompileError{Code: CodeScript, Msg: err.Error()}
		var se *goja.CompilerSyntaxError
		if errors.As(err, &se) {
			ce.Msg = se.Message
			if se.File != nil {
				pos := se.File.Position(se.Offset)
				ce.Line, ce.Column = pos.Line, pos.Column
				ce.Msg += ce.at()
			}
		}
		var re *goja.CompilerReferenceError
		if errors.As(err, &re) {
			ce.Msg = re.Message
			if re.File != nil {
				pos := re.File.Position(re.Offset)
				ce.Line, ce.Column = pos.Line, pos.Column
				ce.Msg += ce.at()
			}
		}
		return nil, ce
	}
	return c, nil
}

func (o Options) withDefaults() Options {
	if o.Deadline <= 0 {
		o.Deadline = DefaultDeadline
	}
	if o.Location == nil {
		o.Location = time.UTC
	}
	if o.MaxAbandoned <= 0 {
		o.MaxAbandoned = DefaultMaxAbandoned
	}
	return o
}

// Close releases the idle runtimes. Calls after Close still work, each on a fresh
// runtime that is released when it finishes (slowly: avoid it). It is safe to call
// more than once.
func (s *Script) Close() { s.p.close() }

func (p *pool) close() {
	p.closed.Store(true)
	p.drainLocal()
	for {
		select {
		case w := <-p.idle:
			p.retire(w)
		default:
			return
		}
	}
}

func (p *pool) retire(w *worker) {
	if w.timer != nil {
		w.timer.Stop()
	}
	close(w.req)
	<-p.slots
}

var errDeadline = errors.New("deadline")

// maxReason bounds a failure reason: it may quote the script's exception, which ends
// up in logs and audit records.
const maxReason = 200

func deny(reason string) Result {
	if len(reason) > maxReason {
		reason = strings.ToValidUTF8(reason[:maxReason], "") + "…"
	}
	return Result{Exit: "deny", Failed: true, Reason: reason}
}

var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// Eval runs FindProxyForURL for one call and maps its answer (ParseResult). It is safe
// for concurrent use and returns by the deadline whatever the script does: a runtime
// that does not stop when interrupted is abandoned, and while MaxAbandoned of them are
// still running, calls fail at once.
func (s *Script) Eval(c Call) Result {
	if s.p.inline {
		return s.p.evalInline(c)
	}
	return s.p.evalHandoff(c, sinceBase()+s.p.deadline)
}

// NeedsAddr reports whether the script's answer for a host name can depend on the
// destination address (Call.Dst): it can call dnsResolve, dnsResolveEx, isResolvable,
// isResolvableEx or isInNet (which resolves a name through dnsResolve), by name or
// through the global object under a computed name. A caller that knows only the name
// should then resolve it before Eval, as a transparent capture knows the address
// anyway; otherwise the same flow would get another answer in each mode.
func (s *Script) NeedsAddr() bool { return s.p.needsAddr }

// Path is how calls run: PathInline or PathHandoff, and for the hand-off path what
// kept the script off the inline one (the first such construct, with its line).
func (s *Script) Path() (path, why string) {
	if s.p.inline {
		return PathInline, ""
	}
	return PathHandoff, s.p.why
}

// Values of Script.Path.
const (
	// PathInline: the call runs on the caller's goroutine and goja's Interrupt stops
	// it at the deadline. Only for scripts that provably reach nothing Interrupt
	// cannot stop (see classify); a call whose input gets past the inline bounds is
	// run again on the hand-off path.
	PathInline = "inline"
	// PathHandoff: the call is handed to the runtime's own goroutine; a runtime that
	// does not stop at the deadline is abandoned and the caller gets deny.
	PathHandoff = "handoff"
)

// evalInline runs the call on the caller's goroutine.
func (p *pool) evalInline(c Call) Result {
	until := sinceBase() + p.deadline
	var timer *time.Timer
	h := p.getInline(&timer, until)
	if timer != nil {
		timer.Stop()
		timers.Put(timer)
	}
	if h == nil {
		return deny(fmt.Sprintf("no runtime free within the %v deadline", p.deadline))
	}
	r, handoff := h.w.runInline(c, until)
	p.putInline(h)
	if handoff {
		// An input past the inline bounds: run it where anything may run.
		p.handoffs.Add(1)
		if until > sinceBase() {
			return p.evalHandoff(c, until)
		}
		return deny(fmt.Sprintf("script did not finish within %v", p.deadline))
	}
	return r
}

// runInline runs one call on the caller's goroutine; the runtime's timer watches its
// heap and interrupts it at the deadline until (memwatch.go). handoff: a guard stopped
// it (guard.go).
func (w *worker) runInline(c Call, until time.Duration) (r Result, handoff bool) {
	d := until - sinceBase()
	if d <= 0 {
		return deny(fmt.Sprintf("script did not finish within %v", w.p.deadline)), false
	}
	w.until.Store(int64(until))
	w.inlineCall = true
	r, stopped := w.run(c, firstTick(d))
	w.timer.Stop()
	w.inlineCall = false
	tripped := w.tripped
	w.tripped = false
	if stopped {
		return r, false // the deadline or the heap bound
	}
	if tripped {
		w.vm.ClearInterrupt()
		return Result{}, true
	}
	return r, false
}

// evalHandoff hands the call to a runtime's goroutine and waits for it until the
// deadline until (a sinceBase time), watching its heap meanwhile (memwatch.go).
func (p *pool) evalHandoff(c Call, until time.Duration) Result {
	if n := p.abandoned.Load(); n >= p.maxAbandoned {
		return deny(fmt.Sprintf("%d runtimes are stuck past their deadline", n))
	}
	timer := timers.Get().(*time.Timer)
	timer.Reset(firstTick(until - sinceBase()))
	defer func() {
		timer.Stop()
		timers.Put(timer)
	}()
	var w *worker
	if p.inline {
		if h := p.getInline(&timer, until); h != nil {
			w = h.unwrap()
		}
	} else {
		w = p.acquire(timer, until)
	}
	if w == nil {
		return deny(fmt.Sprintf("no runtime free within the %v deadline", p.deadline))
	}
	// Check again: while this call waited, others may have been abandoned. With the
	// check here, at most MaxAbandoned-1 plus the pool size runtimes are ever stuck.
	if n := p.abandoned.Load(); n >= p.maxAbandoned {
		p.release(w)
		return deny(fmt.Sprintf("%d runtimes are stuck past their deadline", n))
	}
	w.state.Store(stateRunning)
	if p.inline {
		go w.loop(true) // an inline pool's runtimes have no goroutine of their own
	}
	w.req <- request{call: c}
	if r, ok := w.watchWait(timer, until); ok {
		p.release(w)
		return r
	}
	if w.state.CompareAndSwap(stateRunning, stateAbandoned) {
		w.vm.Interrupt(errDeadline)
		p.abandoned.Add(1)
		<-p.slots // the abandoned runtime no longer counts as live
		if !p.closed.Load() {
			p.replace(true)
		}
		return deny(fmt.Sprintf("script did not finish within %v", p.deadline))
	}
	r := <-w.resp // it finished just as the deadline passed
	p.release(w)
	return r
}

// acquire returns an idle runtime, a new one while there are fewer than the pool
// size, or waits for one until the deadline until (nil). The timer is the call's
// (armed at firstTick): it is armed again on each tick before the deadline.
func (p *pool) acquire(timer *time.Timer, until time.Duration) *worker {
	select {
	case w := <-p.idle:
		return w
	default:
	}
	// None idle: grow the pool if it may, off this call's path, and wait for
	// whichever runtime is free first.
	p.replace(false)
	for {
		select {
		case w := <-p.idle:
			return w
		case <-timer.C:
			left := until - sinceBase()
			if left <= 0 {
				return nil
			}
			timer.Reset(min(left, memTick))
		}
	}
}

// start makes a runtime and runs the script's top-level code in it within limit. The
// caller holds a slot for it; on failure the slot is given back.
func (p *pool) start(limit time.Duration) (*worker, error) {
	w := p.newWorker()
	until := sinceBase() + limit
	timer := time.NewTimer(firstTick(limit))
	defer timer.Stop()
	w.req <- request{init: true}
	if _, ok := w.watchWait(timer, until); !ok {
		if w.state.CompareAndSwap(stateRunning, stateAbandoned) {
			w.vm.Interrupt(errDeadline)
			p.abandoned.Add(1)
			<-p.slots
			return nil, &CompileError{Code: CodeScript, Msg: fmt.Sprintf("top-level code did not finish within %v", limit)}
		}
		<-w.resp
	}
	if w.broken {
		p.retire(w)
		return nil, w.initErr
	}
	return w, nil
}

// replace starts setting up a new runtime in the background if the pool has room for
// one. A spare one is for no call in particular: one per core at Compile, and one as
// soon as a runtime is abandoned, so that the calls after a stuck one find a runtime
// ready rather than wait for one to be set up (which may take longer than a deadline).
func (p *pool) replace(spare bool) {
	select {
	case p.slots <- struct{}{}:
		go p.grow(spare)
	default:
	}
}

// grow adds one runtime to the pool (the caller holds its slot).
func (p *pool) grow(spare bool) {
	w, err := p.start(p.setupLimit())
	if err != nil {
		if p.log != nil {
			p.log.Warn("pac: cannot add a runtime", "script", p.name, "err", err)
		}
		return
	}
	// Into the pool even when it is closed: a call may be waiting for it, and release
	// retires it afterwards. A spare one no call waits for is retired now.
	p.idle <- w
	if spare && p.closed.Load() {
		p.close()
	}
}

// setupLimit bounds setting up a runtime and running the script's top-level code.
// That is not a flow's evaluation, so it gets more than the deadline: a busy machine
// must not turn a load or pool growth into a failure.
func (p *pool) setupLimit() time.Duration { return max(10*p.deadline, time.Second) }

func (p *pool) release(w *worker) {
	if w.broken || p.closed.Load() {
		p.retire(w)
		return
	}
	p.idle <- w // never blocks: idle and slots have the same capacity
	if p.closed.Load() {
		p.close()
	}
}

const (
	stateIdle int32 = iota
	stateRunning
	stateAbandoned
)

type request struct {
	call Call
	init bool
}

// worker owns one goja runtime and the goroutine that runs it.
type worker struct {
	p     *pool
	req   chan request
	resp  chan Result
	state atomic.Int32

	vm      *goja.Runtime
	fn      goja.Callable
	broken  bool  // the runtime could not be set up: retire it
	initErr error // why (a *CompileError)

	call     Call
	host     string // the normalised host handed to the script
	rng      uint64
	loc      *time.Location
	log      *slog.Logger
	shexp    shexpCache
	results  map[string]Result   // ParseResult of recent return values
	argCache map[string]callArgs // arguments for recent hosts

	vTrue, vFalse goja.Value
	argv          [2]goja.Value
	stack         []goja.Value   // lent to goja between calls (stack.go)
	depth         int            // goja natives running inside one another (depth.go)
	joining       []*goja.Object // the arrays being joined (bounds.go)

	// Independent calls (state.go): gen counts calls; loading is set while top-level
	// code runs.
	globals []*globalVar
	resets  []reset
	setTime goja.Callable
	gen     uint64
	loading bool

	// concatOver is gen+1 once the call (gen) has concatenated past the bound, and
	// throwRange throws the bounds' RangeError (concat.go).
	concatOver uint64
	throwRange func(format string, a ...any)

	// The inline path (inline pools only): timer ticks the call's watch and
	// interrupts it at its deadline, until (memwatch.go); inlineCall turns the guards
	// on; tripped is set by a guard.
	timer      *time.Timer
	until      atomic.Int64
	inlineCall bool
	tripped    bool

	// The watch of the running call (memwatch.go): mem is written by both sides, cause
	// by the tick that interrupts the call; watchGen and watchBase, under watchMu, by
	// the ticks.
	mem                 atomic.Uint64
	cause               error
	watchMu             sync.Mutex
	watchGen, watchBase uint64
}

func (p *pool) newWorker() *worker {
	// The runtime is made here, before the goroutine starts, so that a caller may
	// Interrupt it at any time (an interrupt before it runs takes effect when it does).
	w := &worker{p: p, vm: goja.New(), req: make(chan request, 1), resp: make(chan Result, 1), loc: p.loc, log: p.log}
	w.state.Store(stateRunning)
	if p.inline {
		w.timer = time.AfterFunc(time.Hour, w.inlineTick)
		w.timer.Stop()
	}
	go w.loop(p.inline)
	return w
}

// loop serves the runtime's requests on its own goroutine; once: only the next one
// (an inline pool's runtime, which is only handed off when a call has to be).
func (w *worker) loop(once bool) {
	for rq := range w.req {
		var r Result
		if w.fn == nil && !w.broken {
			if err := w.setup(); err != nil {
				w.broken = true
				w.initErr = err
				r = deny(err.Error())
			}
		}
		if !rq.init && !w.broken {
			r, _ = w.run(rq.call, 0)
		}
		if !w.state.CompareAndSwap(stateRunning, stateIdle) {
			// The caller gave up on us: drop this runtime, it may be mid-way through
			// anything. The pool makes a fresh one when it needs it.
			w.p.abandoned.Add(-1)
			return
		}
		w.resp <- r
		if once {
			return
		}
	}
}

// setup builds the sandbox and runs the script's top-level code.
func (w *worker) setup() (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &CompileError{Code: CodeScript, Msg: fmt.Sprintf("setting up the runtime: %v", v)}
		}
	}()
	if d := w.p.setupDelay; d > 0 {
		time.Sleep(d) // tests: a slow machine
	}
	vm := w.vm
	vm.SetMaxCallStackSize(maxStack)
	vm.SetTimeSource(w.now)
	vm.SetRandSource(w.random)
	w.install()
	if err := w.installBounds(); err != nil {
		return &CompileError{Code: CodeScript, Msg: "setting up the allocation bounds: " + err.Error()}
	}
	if err := w.removeUnallocatable(); err != nil {
		return &CompileError{Code: CodeScript, Msg: "removing the typed arrays: " + err.Error()}
	}
	if w.p.inline {
		if err := w.installGuards(); err != nil {
			return &CompileError{Code: CodeScript, Msg: "setting up the inline guards: " + err.Error()}
		}
		for i, lit := range w.p.regexes {
			re, err := vm.RunString(lit)
			if err == nil {
				err = vm.Set(regexGlobal(i), re)
			}
			if err != nil {
				return &CompileError{Code: CodeScript, Msg: fmt.Sprintf("regex literal %s: %v", lit, err)}
			}
		}
	}
	if err := installDateZone(vm, w.loc); err != nil {
		return &CompileError{Code: CodeScript, Msg: "setting up Date: " + err.Error()}
	}
	// Last: its wrapper is the outermost, so that it also counts what the other
	// wrappers convert before they call the native they wrap.
	if err := w.installDepth(); err != nil {
		return &CompileError{Code: CodeScript, Msg: "setting up the native depth bound: " + err.Error()}
	}
	// After it: the functions that replace them call nothing, and keep a prototype
	// that the depth wrapper would not.
	if err := w.removeCodeGeneration(); err != nil {
		return &CompileError{Code: CodeScript, Msg: "removing eval and Function: " + err.Error()}
	}
	// After installDepth too, which wraps the template's check (concat.go).
	if err := w.lockConcatGuard(); err != nil {
		return &CompileError{Code: CodeScript, Msg: "setting up the concatenation bound: " + err.Error()}
	}
	sealer, err := w.prepareState()
	if err != nil {
		return &CompileError{Code: CodeScript, Msg: "setting up the global variables: " + err.Error()}
	}
	// Top-level code belongs to no flow: it sees a fixed time and seed, so that it
	// computes the same thing on every hop.
	w.call, w.rng = Call{At: time.Unix(0, 0)}, 0
	defer func() { w.call = Call{} }()
	w.loading = true
	w.watchStart()
	_, err = vm.RunProgram(w.p.prog)
	w.loading = false
	if w.watchEnd() != nil {
		return &CompileError{Code: CodeScript, Msg: "top-level code stopped: " + memoryMsg}
	}
	if err != nil {
		return scriptError(err, "top-level code")
	}
	fn, ok := goja.AssertFunction(vm.Get("FindProxyForURL"))
	if !ok {
		return &CompileError{Code: CodeScript, Msg: "the script does not define a function FindProxyForURL"}
	}
	if err := w.seal(sealer); err != nil {
		var ex *goja.Exception
		if errors.As(err, &ex) {
			err = errors.New(ex.Value().String())
		}
		return &CompileError{Code: CodeScript, Msg: "sealing the top-level state: " + err.Error()}
	}
	w.fn = fn
	return nil
}

// scriptError turns a goja error at load time into a CompileError with its line.
func scriptError(err error, where string) *CompileError {
	ce := &CompileError{Code: CodeScript, Msg: where + ": " + err.Error()}
	var ex *goja.Exception
	if errors.As(err, &ex) {
		ce.Msg = where + ": " + ex.Value().String()
		ce.Line = stackLine(ex.Stack())
	}
	var ie *goja.InterruptedError
	if errors.As(err, &ie) {
		ce.Msg = where + " did not finish within the deadline"
		if ie.Value() == errConcat {
			ce.Msg = where + " stopped: " + concatMsg
		}
	}
	var so *goja.StackOverflowError
	if errors.As(err, &so) {
		ce.Msg = where + ": " + recursionMsg
		ce.Line = stackLine(so.Stack())
	}
	return ce
}

// stackLine is the line of the innermost frame of a stack that has one (0: none).
func stackLine(stack []goja.StackFrame) int {
	for _, f := range stack {
		if l := f.Position().Line; l > 0 {
			return l
		}
	}
	return 0
}

// now is the script's time: the call's timestamp, or for a call without one (and for
// top-level code) the Unix epoch, never the clock, which would differ from hop to hop.
func (w *worker) now() time.Time {
	if w.call.At.IsZero() {
		return time.Unix(0, 0)
	}
	return w.call.At
}

// random is Math.random: splitmix64 seeded per call, 53 bits into [0, 1).
func (w *worker) random() float64 {
	w.rng += 0x9e3779b97f4a7c15
	z := w.rng
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}

// run runs one call on this goroutine, watched (memwatch.go): with tick > 0 the
// runtime's timer is armed for it (the inline path), otherwise the caller watches.
// stopped: the watch stopped it (its deadline or the heap bound), and r says which.
func (w *worker) run(c Call, tick time.Duration) (r Result, stopped bool) {
	w.watchStart()
	if tick > 0 {
		w.timer.Reset(tick)
	}
	defer func() {
		if v := recover(); v != nil {
			r = deny(fmt.Sprintf("script failed: %v", v))
		}
		switch w.watchEnd() {
		case nil:
		case errMemory:
			r, stopped = deny("script stopped: "+memoryMsg), true
		default:
			r, stopped = deny(fmt.Sprintf("script did not finish within %v", w.p.deadline)), true
		}
	}()
	return w.invoke(c), false
}

// invoke calls FindProxyForURL and maps its answer.
func (w *worker) invoke(c Call) Result {
	w.lendStack()
	if err := w.resetState(); err != nil {
		return deny("script made its state impossible to reset: " + err.Error())
	}
	w.call = c
	w.rng = c.Seed
	a := w.args(c)
	w.host = a.host
	// The arguments go through the runtime's own slice: a variadic call would
	// allocate one per call (goja copies them onto its stack).
	w.argv[0], w.argv[1] = a.urlV, a.hostV
	v, err := w.fn(goja.Undefined(), w.argv[:]...)
	w.argv[0], w.argv[1] = nil, nil
	if err != nil {
		var ie *goja.InterruptedError
		if errors.As(err, &ie) {
			if ie.Value() == errConcat {
				return deny("script stopped: " + concatMsg)
			}
			return deny("script interrupted at its deadline")
		}
		var ex *goja.Exception
		if errors.As(err, &ex) {
			return deny("script threw: " + ex.Value().String())
		}
		var so *goja.StackOverflowError
		if errors.As(err, &so) {
			return deny("script failed: " + recursionMsg)
		}
		return deny("script failed: " + err.Error())
	}
	if v == nil || goja.IsUndefined(v) || goja.IsNull(v) {
		return Result{}
	}
	if _, ok := v.(goja.String); !ok {
		return deny(fmt.Sprintf("FindProxyForURL returned %s, not a string", typeOf(v)))
	}
	// Scripts return a handful of distinct strings: remember their mapping, unless
	// the string is long (256 of them could hold gigabytes).
	str := v.String()
	if len(str) > maxCachedResult {
		return ParseResult(str)
	}
	if r, ok := w.results[str]; ok {
		return r
	}
	r := ParseResult(str)
	if w.results == nil || len(w.results) >= resultCacheMax {
		w.results = make(map[string]Result)
	}
	w.results[str] = r
	return r
}

// resultCacheMax bounds the entries of a runtime's caches, maxCachedResult the length
// of a result string worth caching (a list of a dozen proxies is well below it).
const (
	resultCacheMax  = 256
	maxCachedResult = 4 << 10
)

// callArgs are FindProxyForURL's arguments for a host, ready for the runtime.
type callArgs struct {
	host        string
	urlV, hostV goja.Value
}

// args builds the arguments, remembering them for recent hosts on the default https
// port (most flows go to hosts seen before).
func (w *worker) args(c Call) callArgs {
	cacheable := c.Host != "" && c.Scheme == "" && (c.Port == 0 || c.Port == 443)
	if cacheable {
		if a, ok := w.argCache[c.Host]; ok {
			return a
		}
	}
	url, host := BuildURL(c)
	a := callArgs{host: host, urlV: w.vm.ToValue(url), hostV: w.vm.ToValue(host)}
	if cacheable {
		if w.argCache == nil || len(w.argCache) >= resultCacheMax {
			w.argCache = make(map[string]callArgs)
		}
		w.argCache[c.Host] = a
	}
	return a
}

// typeOf names the JavaScript type of a value that is not a string, null or undefined,
// with its article, as typeof would.
func typeOf(v goja.Value) string {
	if o, ok := v.(*goja.Object); ok {
		if _, ok := goja.AssertFunction(o); ok {
			return "a function"
		}
		return "an object"
	}
	if _, ok := v.(*goja.Symbol); ok {
		return "a symbol"
	}
	switch v.Export().(type) {
	case bool:
		return "a boolean"
	case int64, float64:
		return "a number"
	case *big.Int:
		return "a bigint"
	}
	return "a value"
}

// BuildURL returns the url and host arguments FindProxyForURL gets for a call, the way
// Chromium builds them for https: scheme and host only (no path or query, which an
// https proxy decision never sees), a port only when it is not the scheme's default,
// the host lower-cased and without IPv6 brackets (the URL keeps them).
func BuildURL(c Call) (url, host string) {
	host = c.Host
	if host == "" && c.Dst.IsValid() {
		host = c.Dst.Unmap().WithZone("").String()
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	host = lowerASCII(host)
	scheme := c.Scheme
	if scheme == "" {
		scheme = "https"
	}
	scheme = lowerASCII(scheme)
	hu := host
	if strings.IndexByte(host, ':') >= 0 {
		hu = "[" + host + "]"
	}
	port := ""
	if c.Port != 0 && c.Port != defaultPort(scheme) {
		port = ":" + strconv.Itoa(int(c.Port))
	}
	return scheme + "://" + hu + port + "/", host
}

func defaultPort(scheme string) uint16 {
	switch scheme {
	case "http", "ws":
		return 80
	case "https", "wss":
		return 443
	case "ftp":
		return 21
	}
	return 0
}

func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
