package pac

import (
	"crypto/sha256"
	"os"
	"strings"
	"testing"
	"time"
)

// benchCalls are the benchmark's flows: testdata/bench_hosts.txt, a mix of
// destinations that take different branches of the corporate PAC file, early and late.
// tests/bench feeds pacparser the same list.
func benchCalls(b *testing.B) []Call {
	data, err := os.ReadFile("testdata/bench_hosts.txt")
	if err != nil {
		b.Fatal(err)
	}
	at := time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC)
	var cs []Call
	for i, h := range strings.Fields(string(data)) {
		cs = append(cs, Call{Host: h, Port: 443, At: at, Seed: uint64(i)})
	}
	return cs
}

// reportCPU adds the process's CPU time per op (all threads, GC included) next to the
// wall-clock ns/op: on a shared machine the two differ, and CPU time is the cost.
func reportCPU(b *testing.B, run func()) {
	before := cpuTime()
	b.ResetTimer()
	run()
	b.StopTimer()
	if d := cpuTime() - before; d > 0 {
		b.ReportMetric(float64(d.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkEvalCorporate is one Eval of the 20-branch corporate PAC per op, on one
// goroutine (run with -cpu 1 for the single-core figure).
func BenchmarkEvalCorporate(b *testing.B) {
	s := mustCompile(b, corporatePAC(b), Options{Deadline: time.Second})
	cs := benchCalls(b)
	b.ReportAllocs()
	reportCPU(b, func() {
		for i := 0; i < b.N; i++ {
			if r := s.Eval(cs[i%len(cs)]); r.Failed {
				b.Fatalf("Eval: %+v", r)
			}
		}
	})
}

// BenchmarkEvalCorporateParallel runs Eval from GOMAXPROCS goroutines (with -cpu 1,2:
// the figures tests/bench compares for the 2-core target).
func BenchmarkEvalCorporateParallel(b *testing.B) {
	s := mustCompile(b, corporatePAC(b), Options{Deadline: time.Second})
	cs := benchCalls(b)
	b.ReportAllocs()
	reportCPU(b, func() {
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if r := s.Eval(cs[i%len(cs)]); r.Failed {
					b.Errorf("Eval: %+v", r)
					return
				}
				i++
			}
		})
	})
}

// BenchmarkRunCorporate is the script alone, without the pool and the deadline timer:
// the engine's share of an Eval.
func BenchmarkRunCorporate(b *testing.B) {
	s := mustCompile(b, corporatePAC(b), Options{Deadline: time.Second})
	w, put := borrow(b, s)
	defer put()
	cs := benchCalls(b)
	b.ReportAllocs()
	reportCPU(b, func() {
		for i := 0; i < b.N; i++ {
			if r, _ := w.run(cs[i%len(cs)], 0); r.Failed {
				b.Fatalf("run: %+v", r)
			}
		}
	})
}

func BenchmarkParseResult(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		ParseResult("PROXY proxy.corp.example.com:3128; PROXY proxy2.corp.example.com:3128; DIRECT")
	}
}

func BenchmarkCompileCorporate(b *testing.B) {
	src := corporatePAC(b)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		s, err := Compile("c.pac", src, Options{})
		if err != nil {
			b.Fatal(err)
		}
		s.Close()
	}
}

// BenchmarkRunCorporateParallel is BenchmarkRunCorporate from GOMAXPROCS goroutines,
// each with its own runtime: how the script alone scales, without the pool or timers.
func BenchmarkRunCorporateParallel(b *testing.B) {
	s := mustCompile(b, corporatePAC(b), Options{Deadline: time.Second})
	cs := benchCalls(b)
	b.ReportAllocs()
	reportCPU(b, func() {
		b.RunParallel(func(pb *testing.PB) {
			w, put := borrow(b, s)
			defer put()
			i := 0
			for pb.Next() {
				if r, _ := w.run(cs[i%len(cs)], 0); r.Failed {
					b.Errorf("run: %+v", r)
					return
				}
				i++
			}
		})
	})
}

// BenchmarkCalibrate is a reference for the machine itself: a CPU-bound loop that
// allocates nothing and shares nothing (SHA-256 of 256 bytes), from GOMAXPROCS
// goroutines. Its 2-core/1-core ratio, measured in the same run as the PAC figures, is
// the most any code can scale on this machine at that moment (tests/bench shows both).
func BenchmarkCalibrate(b *testing.B) {
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 256)
		var sum [32]byte
		for pb.Next() {
			sum = sha256.Sum256(buf)
			buf[0] = sum[0]
		}
	})
}
