// Package metrics is kl-relayd's Prometheus instrumentation: flows by exit, dimension and
// rule, active flows, relayed bytes, decision and dial latency, rule reload results and
// audit records that never reached the audit file.
//
// It is not the exporter: the daemon registers these collectors on a Registerer of its
// choosing and serves them on its opt-in address. Like the audit log, no metric carries a
// destination, payload or identity as a label. All methods are safe on a nil *Metrics
// (metrics turned off) and for concurrent use.
package metrics

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const namespace = "kl"

// Metrics holds the relay's collectors.
type Metrics struct {
	flows      *prometheus.CounterVec
	active     *prometheus.GaugeVec
	bytes      *prometheus.CounterVec
	decision   prometheus.Histogram
	dial       *prometheus.HistogramVec
	reloads    *prometheus.CounterVec
	lastReload *prometheus.GaugeVec

	auditDropped prometheus.CounterFunc
	auditSource  atomic.Pointer[func() uint64] // set by AuditDropped
}

// Latency buckets: decisions are microseconds (scripts up to their deadline), dials
// milliseconds to the connect timeout.
var (
	decisionBuckets = []float64{1e-6, 5e-6, 2e-5, 1e-4, 5e-4, 2e-3, 1e-2, 5e-2, 0.1}
	dialBuckets     = []float64{5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
)

// New creates the collectors and registers them on reg (nil: not registered, for tests
// that read them directly).
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		flows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "flows_total",
			Help: "Flows decided, by exit, deciding dimension and rule number (0 for default, guard and script).",
		}, []string{"exit", "dimension", "rule"}),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "active_flows",
			Help: "Flows being relayed now, by exit.",
		}, []string{"exit"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "relayed_bytes_total",
			Help: "Bytes relayed, by exit and direction (up: workload to destination, down: back).",
		}, []string{"exit", "direction"}),
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "decision_duration_seconds",
			Help:    "Time to decide a flow's exit, including hostname sniffing and process lookup.",
			Buckets: decisionBuckets,
		}),
		dial: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "dial_duration_seconds",
			Help:    "Time to connect to the destination through the chosen exit, by exit and result (ok or error).",
			Buckets: dialBuckets,
		}, []string{"exit", "result"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "rules_reloads_total",
			Help: "Rules file loads, by result (ok or error) and reason code (empty when ok).",
		}, []string{"result", "code"}),
		lastReload: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "rules_last_reload_timestamp_seconds",
			Help: "Unix time of the last rules load, by result.",
		}, []string{"result"}),
	}
	m.auditDropped = prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: namespace, Name: "audit_records_dropped_total",
		Help: "Decision records that never reached the audit file: its disk did not take them before 4 MiB were waiting, or before shutdown.",
	}, func() float64 {
		if f := m.auditSource.Load(); f != nil {
			return float64((*f)())
		}
		return 0
	})
	if reg != nil {
		for _, c := range m.collectors() {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.flows, m.active, m.bytes, m.decision, m.dial, m.reloads, m.lastReload, m.auditDropped}
}

// ruleLabels avoids formatting small rule numbers on every flow.
var ruleLabels = func() [256]string {
	var a [256]string
	for i := range a {
		a[i] = strconv.Itoa(i)
	}
	return a
}()

func ruleLabel(rule int) string {
	if rule >= 0 && rule < len(ruleLabels) {
		return ruleLabels[rule]
	}
	return strconv.Itoa(rule)
}

// Decided counts one decided flow and observes how long deciding took.
func (m *Metrics) Decided(exit, dimension string, rule int, took time.Duration) {
	if m == nil {
		return
	}
	m.flows.WithLabelValues(exit, dimension, ruleLabel(rule)).Inc()
	m.decision.Observe(took.Seconds())
}

// Dialed observes a connection attempt through exit.
func (m *Metrics) Dialed(exit string, took time.Duration, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.dial.WithLabelValues(exit, result).Observe(took.Seconds())
}

// Start tracks one relayed flow: call Start when relaying begins and the returned
// function once with the byte counts when it ends.
func (m *Metrics) Start(exit string) (done func(up, down int64)) {
	if m == nil {
		return func(int64, int64) {}
	}
	g := m.active.WithLabelValues(exit)
	g.Inc()
	return func(up, down int64) {
		g.Dec()
		m.bytes.WithLabelValues(exit, "up").Add(float64(up))
		m.bytes.WithLabelValues(exit, "down").Add(float64(down))
	}
}

// Reloaded records a rules load: code is the reason code of a refused file ("" on
// success).
func (m *Metrics) Reloaded(at time.Time, code string) {
	if m == nil {
		return
	}
	result := "ok"
	if code != "" {
		result = "error"
	}
	m.reloads.WithLabelValues(result, code).Inc()
	m.lastReload.WithLabelValues(result).Set(float64(at.UnixNano()) / 1e9)
}

// AuditDropped makes kl_audit_records_dropped_total report dropped(), the audit log's
// count of records that never reached its file, at every scrape.
func (m *Metrics) AuditDropped(dropped func() uint64) {
	if m == nil {
		return
	}
	m.auditSource.Store(&dropped)
}
