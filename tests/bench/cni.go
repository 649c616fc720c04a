package main

import (
	"context"
	"fmt"
)

func init() {
	register(Section{
		Name: "cni",
		Doc: "kl-cni ADD and DEL against a running kl-relayd: 500 sandbox netns are added (all " +
			"live at once, one relay listener each) and then removed, timing every call " +
			"(tests/e2e BenchmarkCNIChurn). `wall` is the whole plugin process as a runtime " +
			"sees it; `work` is the plugin's own part after process start (the registration " +
			"round trip, in which the relay installs the pod's nftables table and opens its " +
			"listener). The process floor, measured after every ADD of the same run, is an " +
			"exec of /bin/true and of `kl-cni VERSION` (starting the plugin, no work). " +
			"Leaks are the relay's descriptors and goroutines after all DELs minus before " +
			"(TestCNIChurn asserts them). Target: ADD <= 20 ms p50.",
		Run: runCNI,
	})
}

func runCNI(ctx context.Context) ([]Row, error) {
	if err := needRoot(); err != nil {
		return nil, err
	}
	res, err := goBench(ctx, "./tests/e2e", "^BenchmarkCNIChurn$", "-benchtime=1x", "-timeout=20m")
	if err != nil {
		return nil, err
	}
	m := res[0].Metrics
	ms := func(k string) string { return fmt.Sprintf("%.1f ms", m[k]) }
	return []Row{
		{Name: "ADD (500 sandboxes)", Cols: []Col{
			{"wall p50", ms("add-p50-ms")}, {"wall p99", ms("add-p99-ms")},
			{"work p50", ms("add-work-p50-ms")}, {"work p99", ms("add-work-p99-ms")},
		}},
		{Name: "DEL (500 sandboxes)", Cols: []Col{
			{"wall p50", ms("del-p50-ms")}, {"wall p99", ms("del-p99-ms")},
			{"work p50", ms("del-work-p50-ms")}, {"work p99", ms("del-work-p99-ms")},
		}},
		{Name: "process floor (same run)", Cols: []Col{
			{"/bin/true p50", ms("exec-true-p50-ms")}, {"kl-cni VERSION p50", ms("exec-version-p50-ms")},
		}},
		{Name: "relay after 500 ADD+DEL", Cols: []Col{
			{"fds with 500 live", fmt.Sprintf("+%.0f", m["fds-500-live"])},
			{"leaked fds", fmt.Sprintf("%.0f", m["leaked-fds"])},
			{"leaked goroutines", fmt.Sprintf("%.0f", m["leaked-goroutines"])},
		}},
	}, nil
}
