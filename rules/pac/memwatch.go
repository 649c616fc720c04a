package pac

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"time"
	"weak"
)

// maxHeapGrowth bounds how far the process's heap may grow while a call (or a
// script's top-level code) runs: a loop of cheap natives ("var a = []; for (;;)
// a.push("x".repeat(2**24) + i)") took gigabytes well within a deadline, more within
// the second that top-level code gets. The bounds of bounds.go keep each native call
// small; this stops the loop that adds them up. The heap is the whole process's, read
// every memTick: a call is interrupted when the heap has grown past maxHeapGrowth
// since the first tick that saw it running, so the bound holds for all calls together
// too (a call running beside a runaway one may be stopped with it). Garbage does not
// count: past the bound the watch collects it first (a full GC, only then). A PAC
// call allocates a few hundred bytes.
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
	memIdle        = 0
	memRunning     = 1
	memInterrupted = 2 // the watch is interrupting it, or has
	memStateMask   = 3
)

// memWatch is the goroutine that reads the heap every memTick while there are
// runtimes, and the runtimes it watches (weak: a runtime that is garbage drops out).
type memWatch struct {
	mu      sync.Mutex
	workers []weak.Pointer[worker]
	running bool
}

var heapWatch memWatch

// add watches w's calls from now on.
func (m *memWatch) add(w *worker) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.workers = append(m.workers, weak.Make(w))
	if !m.running {
		m.running = true
		go m.loop()
	}
}

func (m *memWatch) loop() {
	t := time.NewTicker(memTick)
	defer t.Stop()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	for range t.C {
		if !m.tick(sample) {
			return
		}
	}
}

// tick checks the running calls once; false when no runtime is left to watch.
func (m *memWatch) tick(sample []metrics.Sample) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	var heap uint64
	collected := false
	live := m.workers[:0]
	for _, p := range m.workers {
		w := p.Value()
		if w == nil {
			continue
		}
		live = append(live, p)
		v := w.mem.Load()
		if v&memStateMask != memRunning {
			continue
		}
		if heap == 0 {
			metrics.Read(sample)
			heap = sample[0].Value.Uint64()
		}
		if gen := v >> 2; gen != w.watchGen {
			w.watchGen, w.watchBase = gen, heap // a call seen for the first time
			continue
		}
		if heap > w.watchBase+maxHeapGrowth && !collected {
			// The heap counts garbage not yet collected: collect it first, so that
			// a loop that keeps nothing is never stopped (nor a call beside one).
			runtime.GC()
			metrics.Read(sample)
			heap, collected = sample[0].Value.Uint64(), true
		}
		if heap > w.watchBase+maxHeapGrowth && w.mem.CompareAndSwap(v, v&^memStateMask|memInterrupted) {
			w.vm.Interrupt(errMemory)
		}
	}
	clear(m.workers[len(live):])
	m.workers = live
	if len(live) == 0 {
		m.running = false
		return false
	}
	return true
}

// watchStart marks the start of a call (or of the top-level code) on w's goroutine.
func (w *worker) watchStart() {
	w.mem.Store((w.mem.Load()>>2+1)<<2 | memRunning)
}

// watchEnd marks its end: true if the watch interrupted it. The interrupt is cleared,
// so that it cannot land in the next call.
func (w *worker) watchEnd() bool {
	v := w.mem.Load()
	if v&memStateMask == memRunning && w.mem.CompareAndSwap(v, v&^memStateMask) {
		return false
	}
	// memInterrupted: the watch has called Interrupt or is about to, under its lock.
	heapWatch.mu.Lock()
	heapWatch.mu.Unlock()
	w.vm.ClearInterrupt()
	w.mem.Store(v &^ memStateMask)
	runtime.KeepAlive(w)
	return true
}
