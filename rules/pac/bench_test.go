package pac

import (
	"testing"
	"time"
)

// benchHosts is a mix of destinations that take different branches of the corporate
// PAC file, early and late. tests/bench feeds pacparser the same list.
var benchHosts = []string{
	"www.example.org", "a.corp.example.com", "10.1.2.3", "eu1.salesforce.com", "x.sharepoint.com",
	"api.github.com", "ads.example.com", "api.partner-a.example", "updates.vendor.example", "intranet",
	"cdn.static.example.net", "api7.payments.example", "192.168.1.20", "wiki.example.com", "mail.example.com",
	"x.svc.cluster.local",
}

// BenchHosts returns the benchmark's host mix (for tests/bench).
func benchCalls() []Call {
	at := time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC)
	cs := make([]Call, len(benchHosts))
	for i, h := range benchHosts {
		cs[i] = Call{Host: h, Port: 443, At: at, Seed: uint64(i)}
	}
	return cs
}

// BenchmarkEvalCorporate is one Eval of the 20-branch corporate PAC per op, on one
// goroutine (run with -cpu 1 for the single-core figure).
func BenchmarkEvalCorporate(b *testing.B) {
	s := mustCompile(b, corporatePAC(b), Options{Deadline: time.Second})
	cs := benchCalls()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if r := s.Eval(cs[i%len(cs)]); r.Failed {
			b.Fatalf("Eval: %+v", r)
		}
	}
}

// BenchmarkEvalCorporateParallel runs Eval from GOMAXPROCS goroutines.
func BenchmarkEvalCorporateParallel(b *testing.B) {
	s := mustCompile(b, corporatePAC(b), Options{Deadline: time.Second})
	cs := benchCalls()
	b.ReportAllocs()
	b.ResetTimer()
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
}

// BenchmarkRunCorporate is the script alone, without the pool's hand-off to the
// runtime's goroutine and the deadline timer: the engine's share of an Eval.
func BenchmarkRunCorporate(b *testing.B) {
	s := mustCompile(b, corporatePAC(b), Options{Deadline: time.Second})
	w := <-s.p.idle
	defer func() { s.p.idle <- w }()
	cs := benchCalls()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if r := w.run(cs[i%len(cs)]); r.Failed {
			b.Fatalf("run: %+v", r)
		}
	}
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
