package main

import (
	"context"
	"fmt"
)

func init() {
	register(Section{
		Name: "attach",
		Doc: "Client route vs direct on one netns topology (tests/attach BenchmarkAttach): a pod in " +
			"transparent mode, the relay and its attach listener in a node netns, `kl-ctl attach` in a " +
			"laptop netns and a corp host behind the laptop. Direct: the relay dials from the pod's " +
			"netns, routed node -> laptop -> corp. Client: the flow crosses the attach session " +
			"(TLS + yamux) to kl-ctl, which re-decides it and dials the corp host. Setup is connect " +
			"to the server's first byte, p50 of 200 sequential connections; throughput is one flow " +
			"of 256 MiB, best of 3. Ratios are client over direct (setup: lower is better).",
		Run: runAttach,
	})
}

func runAttach(ctx context.Context) ([]Row, error) {
	if err := needRoot(); err != nil {
		return nil, err
	}
	res, err := goBench(ctx, "./tests/attach", "^BenchmarkAttach$", "-benchtime=1x", "-timeout=5m")
	if err != nil {
		return nil, err
	}
	m := res[0].Metrics
	us := func(k string) string { return fmt.Sprintf("%.0f µs", m[k]) }
	mibs := func(k string) string { return fmt.Sprintf("%.0f MiB/s", m[k]) }
	return []Row{
		{Name: "setup p50 (connect to first byte)", Cols: []Col{
			{"direct", us("direct-setup-us")}, {"client", us("client-setup-us")},
			{"client/direct", ratio(m["client-setup-us"], m["direct-setup-us"])},
		}},
		{Name: "throughput (one flow, 256 MiB)", Cols: []Col{
			{"direct", mibs("direct-MiB/s")}, {"client", mibs("client-MiB/s")},
			{"client/direct", fmt.Sprintf("%.2fx", m["client-MiB/s"]/max(m["direct-MiB/s"], 1e-9))},
		}},
	}, nil
}
