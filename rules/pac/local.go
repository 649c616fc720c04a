package pac

import (
	"runtime"
	"time"
)

// An inline pool keeps its idle runtimes in a sync.Pool in front of the idle channel:
// sync.Pool has a cache per P, so a call takes and gives back a runtime without
// touching anything another core uses (the channel's lock was the cost that kept two
// cores from doing twice the calls of one). The channel stays the pool's bound and its
// slow path: new runtimes, waiting for one when all are busy.
//
// sync.Pool drops what it holds at garbage collection. A runtime is never lost with
// it: each sits in the sync.Pool inside a handle whose cleanup, run once the handle is
// dropped, returns the runtime to the channel.

// handle carries an idle runtime through the sync.Pool.
type handle struct {
	w       *worker
	cleanup runtime.Cleanup
}

// newHandle wraps a runtime taken from the channel.
func newHandle(w *worker) *handle {
	h := &handle{w: w}
	h.cleanup = runtime.AddCleanup(h, func(w *worker) { w.p.release(w) }, w)
	return h
}

// unwrap takes the runtime out of its handle for good.
func (h *handle) unwrap() *worker {
	h.cleanup.Stop()
	return h.w
}

// getInline returns an idle runtime, from this P's cache if it can, else as acquire
// does (nil when none is free before the deadline until). timer may be nil: it is
// only armed when the call has to wait.
func (p *pool) getInline(timer **time.Timer, until time.Duration) *handle {
	if h, _ := p.local.Get().(*handle); h != nil {
		return h
	}
	select {
	case w := <-p.idle:
		return newHandle(w)
	default:
	}
	// Waiting: runtimes given back from now on go to the channel (putInline). One
	// given back just before that is in some P's cache: look again.
	p.waiting.Add(1)
	defer p.waiting.Add(-1)
	if h, _ := p.local.Get().(*handle); h != nil {
		return h
	}
	if *timer == nil {
		*timer = timers.Get().(*time.Timer)
		(*timer).Reset(firstTick(until - sinceBase()))
	}
	if w := p.acquire(*timer, until); w != nil {
		return newHandle(w)
	}
	return nil
}

// putInline gives a runtime back: to this P's cache, or to the channel when calls are
// waiting for one or the pool is closed.
func (p *pool) putInline(h *handle) {
	if raceEnabled || h.w.broken || p.waiting.Load() > 0 || p.closed.Load() {
		p.release(h.unwrap())
		return
	}
	p.local.Put(h)
	if p.closed.Load() {
		p.drainLocal()
	}
}

// drainLocal retires the runtimes cached in the sync.Pool that it can reach (those of
// other Ps come back through their handles' cleanups).
func (p *pool) drainLocal() {
	for {
		h, _ := p.local.Get().(*handle)
		if h == nil {
			return
		}
		p.retire(h.unwrap())
	}
}
