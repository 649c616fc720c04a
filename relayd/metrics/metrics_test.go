package metrics

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Decided("proxy", "domain", 2, 3*time.Microsecond)
	m.Decided("proxy", "domain", 2, 40*time.Microsecond)
	m.Decided("direct", "default", 0, time.Microsecond)
	m.Decided("deny", "cidr", 300, time.Microsecond)
	m.Dialed("proxy", 2*time.Millisecond, nil)
	m.Dialed("proxy", 3*time.Second, errors.New("upstream down"))
	done := m.Start("proxy")
	m.Start("direct")
	done(100, 2000)
	m.Reloaded(time.Unix(1700000000, 0), "")
	m.Reloaded(time.Unix(1700000100, 0), "E_SYNTAX")
	m.AuditDropped(func() uint64 { return 12 })

	want := `
# HELP kl_flows_total Flows decided, by exit, deciding dimension and rule number (0 for default, guard and script).
# TYPE kl_flows_total counter
kl_flows_total{dimension="cidr",exit="deny",rule="300"} 1
kl_flows_total{dimension="default",exit="direct",rule="0"} 1
kl_flows_total{dimension="domain",exit="proxy",rule="2"} 2
# HELP kl_active_flows Flows being relayed now, by exit.
# TYPE kl_active_flows gauge
kl_active_flows{exit="direct"} 1
kl_active_flows{exit="proxy"} 0
# HELP kl_relayed_bytes_total Bytes relayed, by exit and direction (up: workload to destination, down: back).
# TYPE kl_relayed_bytes_total counter
kl_relayed_bytes_total{direction="down",exit="proxy"} 2000
kl_relayed_bytes_total{direction="up",exit="proxy"} 100
# HELP kl_rules_reloads_total Rules file loads, by result (ok or error) and reason code (empty when ok).
# TYPE kl_rules_reloads_total counter
kl_rules_reloads_total{code="",result="ok"} 1
kl_rules_reloads_total{code="E_SYNTAX",result="error"} 1
# HELP kl_rules_last_reload_timestamp_seconds Unix time of the last rules load, by result.
# TYPE kl_rules_last_reload_timestamp_seconds gauge
kl_rules_last_reload_timestamp_seconds{result="error"} 1.7000001e+09
kl_rules_last_reload_timestamp_seconds{result="ok"} 1.7e+09
# HELP kl_audit_records_dropped_total Decision records that never reached the audit file: its disk did not take them before 4 MiB were waiting, or before shutdown.
# TYPE kl_audit_records_dropped_total counter
kl_audit_records_dropped_total 12
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"kl_flows_total", "kl_active_flows", "kl_relayed_bytes_total", "kl_rules_reloads_total", "kl_rules_last_reload_timestamp_seconds", "kl_audit_records_dropped_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.decision); n != 1 {
		t.Fatalf("decision histogram: %d series", n)
	}
	if n := testutil.CollectAndCount(m.dial); n != 2 {
		t.Fatalf("dial histogram: %d series, want ok and error", n)
	}
	if lint, err := testutil.GatherAndLint(reg); err != nil || len(lint) > 0 {
		t.Fatalf("metric lint: %v %v", lint, err)
	}
	// Registering twice on one registry is an error, not a panic.
	if _, err := New(reg); err == nil {
		t.Fatal("second New on the same registry succeeded")
	}
}

func TestNilMetrics(t *testing.T) {
	var m *Metrics
	m.Decided("direct", "default", 0, time.Microsecond)
	m.Dialed("direct", time.Millisecond, nil)
	m.Start("direct")(1, 2)
	m.Reloaded(time.Now(), "")
	m.AuditDropped(func() uint64 { return 1 })
}

func TestDecidedAllocs(t *testing.T) {
	m, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	m.Decided("proxy", "domain", 7, time.Microsecond)
	if n := testing.AllocsPerRun(1000, func() { m.Decided("proxy", "domain", 7, time.Microsecond) }); n != 0 {
		t.Fatalf("Decided allocates %v times per flow, want 0", n)
	}
}
