package pac

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/metrics"
	"time"
)

// maxHeapGrowth bounds how far the process's heap may grow while a call (or a
// script's top-level code) runs: a loop of cheap natives ("var a = []; for (;;)
// a.push("x".repeat(2**24) + i)") took gigabytes well within a deadline, more within
// the second that top-level code gets. The bounds of bounds.go keep each native call
// small; this stops the loop that adds them up. The heap is the whole process's: a
// call is interrupted when the heap has grown past maxHeapGrowth since the first tick
// of its watch, so the bound holds for all calls together too (a call running beside a
// runaway one may be stopped with it). Garbage does not count: past the bound the
// watch collects it first (a full GC, only then). A PAC call allocates a few hundred
// bytes.
//
// The watch ticks on the timer that already bounds the call: the runtime's own timer
// on the inline path (inlineTick), the caller's on the hand-off path and for top-level
// code (watchWait). It is armed at min(time left, memTick); each time it fires before
// the deadline it reads the heap and is armed again, and at the deadline it stops the
// call as before. So a call shorter than memTick costs no more timer work than its
// deadline did, and nothing ticks between calls: an idle daemon with a PAC policy
// loaded has no timer armed and no goroutine awake.
const (
	maxHeapGrowth = 256 << 20
	memTick       = 5 * time.Millisecond
)

// errMemory interrupts a call that grew the heap past maxHeapGrowth.
var errMemory = errors.New("memory")

// memoryMsg says why such a call failed.
var memoryMsg = fmt.Sprintf("the heap grew by more than %d MiB while it ran", maxHeapGrowth>>20)

// A worker's mem word: the number of its calls so far (the high bits) and the state of
// the current one (the low two bits).
const (
	memIdle         = 0
	memRunning      = 1
	memInterrupting = 2 // a tick is stopping it: Interrupt is about to be called
	memInterrupted  = 3 // Interrupt has been called; w.cause says why
	memStateMask    = 3
)

// clockBase is the origin of the monotonic times the watch compares (sinceBase).
var clockBase = time.Now()

func sinceBase() time.Duration { return time.Since(clockBase) }

// firstTick is when a call's timer first fires, d before its deadline.
func firstTick(d time.Duration) time.Duration { return min(d, memTick) }

func readHeap() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// watchStart marks the start of a call (or of the top-level code) on w's goroutine.
func (w *worker) watchStart() {
	w.mem.Store((w.mem.Load()>>2+1)<<2 | memRunning)
}

// watchEnd marks its end: nil, or why a tick stopped it (errMemory, errDeadline). The
// interrupt is cleared, so that it cannot land in the next call.
func (w *worker) watchEnd() error {
	v := w.mem.Load()
	if v&memStateMask == memRunning && w.mem.CompareAndSwap(v, v&^memStateMask) {
		return nil
	}
	for w.mem.Load()&memStateMask == memInterrupting {
		runtime.Gosched() // Interrupt is being called
	}
	w.vm.ClearInterrupt()
	cause := w.cause
	w.mem.Store(v &^ memStateMask)
	return cause
}

// interrupt stops w's call whose mem word is v, for cause, unless it has ended.
func (w *worker) interrupt(v uint64, cause error) {
	if !w.mem.CompareAndSwap(v, v&^memStateMask|memInterrupting) {
		return
	}
	w.cause = cause
	w.vm.Interrupt(cause)
	w.mem.Store(v&^memStateMask | memInterrupted)
}

// checkHeap is a tick of the watch of w's running call, if any: the first one of a
// call reads the heap it starts from, the others stop the call once the heap has grown
// past maxHeapGrowth (garbage collected first).
func (w *worker) checkHeap() {
	v := w.mem.Load()
	if v&memStateMask != memRunning {
		return
	}
	w.watchMu.Lock()
	defer w.watchMu.Unlock()
	heap := readHeap()
	if gen := v >> 2; gen != w.watchGen {
		w.watchGen, w.watchBase = gen, heap
		return
	}
	if heap <= w.watchBase+maxHeapGrowth {
		return
	}
	// The heap counts garbage not yet collected: collect it first, so that a loop
	// that keeps nothing is never stopped (nor a call beside one).
	runtime.GC()
	if readHeap() > w.watchBase+maxHeapGrowth {
		w.interrupt(v, errMemory)
	}
}

// inlineTick is what an inline runtime's timer runs (on a goroutine of its own): a
// tick of the running call's watch, or its deadline (w.until).
func (w *worker) inlineTick() {
	v := w.mem.Load()
	if v&memStateMask != memRunning {
		return // the call has ended: nothing more until the next one arms the timer
	}
	if time.Duration(w.until.Load()) > sinceBase() {
		w.checkHeap()
		if left := time.Duration(w.until.Load()) - sinceBase(); left > 0 {
			if w.mem.Load() == v { // still the same call, still running
				w.timer.Reset(min(left, memTick))
			}
			return
		}
	}
	w.interrupt(v, errDeadline)
}

// watchWait waits for w's answer to a request (a hand-off call or top-level code)
// until the deadline until (a sinceBase time), checking the heap on each tick of
// timer, which the caller armed at firstTick. false: the deadline passed.
func (w *worker) watchWait(timer *time.Timer, until time.Duration) (Result, bool) {
	for {
		select {
		case r := <-w.resp:
			return r, true
		case <-timer.C:
			if left := until - sinceBase(); left > 0 {
				w.checkHeap()
				if left = until - sinceBase(); left > 0 {
					timer.Reset(min(left, memTick))
					continue
				}
			}
			return Result{}, false
		}
	}
}
