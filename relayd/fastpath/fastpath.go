// Package fastpath puts the kernel-decidable part of each pod's policy into the pod's
// own nftables table, and audits the flows the kernel decided.
//
// For every registered pod it computes the pod's KernelPlan (rules.Policy.Plan with the
// pod's labels and image), compiles it to netns.Decisions and installs it with the pod's
// capture in one atomic transaction: flows the plan decides as direct are accepted in
// the kernel with a conntrack mark naming the decision, the rest is redirected to the
// relay as before. The deciding rule also limits the connection's conntrack events to
// NEW, and a watcher in each pod netns (a raw ctnetlink socket with a socket filter on
// the mark, reliable delivery, read in batches) turns each such event into exactly one
// audit record per flow (Path "kernel"); flows the relay carries have no such mark and
// are recorded by the relay, never here.
//
// It is not the relay and does not decide flows itself: the rule engine decides, the
// netns package programs the kernel. The daemon calls Add on register, Reload on every
// rules reload and Remove on deregister; tests use a Manager on its own.
package fastpath

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/rules"
)

// The conntrack mark of a kernel-decided connection: Tag in the top byte, the plan's
// generation (per pod, counting installs) in the next, the decision's id (its entry
// index + 1 in the plan) in the low 16 bits. Marks without the tag are not kl's kernel
// decisions (the relay's own connections carry none).
const (
	Tag      uint32 = 0x6b000000
	TagMask  uint32 = 0xff000000
	genShift        = 16
	idMask   uint32 = 0xffff
	// MaxEntries is how many plan entries can carry their own mark; entries past it
	// (only in plans of more than 65535 rules) go to the relay, which decides them alike.
	MaxEntries = int(idMask)
	// keepGens is how many past generations of a pod's id table are kept, so that a
	// connection marked just before a reload is still recorded with its own decision.
	keepGens = 16
)

// Mark returns the conntrack mark of plan entry id (1-based) in generation gen.
func Mark(gen uint8, id int) uint32 { return Tag | uint32(gen)<<genShift | uint32(id)&idMask }

// splitMark is the inverse of Mark; ok is false for marks that are not kernel decisions.
func splitMark(m uint32) (gen uint8, id int, ok bool) {
	if m&TagMask != Tag || m&idMask == 0 {
		return 0, 0, false
	}
	return uint8(m >> genShift), int(m & idMask), true
}

// Compile turns a plan into the netns package's neutral form: one Decision per plan
// entry after the guard (in order), accepted entries with Mark(gen, index+1), relayed
// ones with mark 0; the guard's mark in Guard.
func Compile(plan *rules.KernelPlan, gen uint8) netns.Decisions {
	var d netns.Decisions
	for i := range plan.Entries {
		e := &plan.Entries[i]
		mark := uint32(0)
		if !e.Relay && i < MaxEntries {
			mark = Mark(gen, i+1)
		}
		if i == 0 && e.Known && e.Decision.Dimension == rules.DimGuard {
			d.Guard = mark
			continue
		}
		nd := netns.Decision{Prefixes: e.Prefixes, Mark: mark}
		if e.Ports != nil {
			nd.Ports = make([]netns.PortRange, len(e.Ports))
			for j, r := range e.Ports {
				nd.Ports[j] = netns.PortRange{From: r.From, To: r.To}
			}
		}
		d.List = append(d.List, nd)
	}
	return d
}

// Where says where a flow to dst of a workload would be decided: "kernel" or "relay",
// with the plan entry that says so (for `kl-ctl explain`).
func Where(p *rules.Policy, labels map[string]string, image string, dst netip.AddrPort) (string, *rules.KernelEntry) {
	e := p.Plan(labels, image).Lookup(dst)
	if e == nil || e.Relay {
		return "relay", e
	}
	return "kernel", e
}

// Sink receives the audit records of kernel-decided flows; *audit.Log is one.
type Sink interface{ Add(audit.Record) }

// Options configure a Manager.
type Options struct {
	Sink Sink         // where records go (nil: counted only)
	Log  *slog.Logger // nil: discard
	// Backend programs the pods' tables; nil is the kernel (netns's nftables backend).
	Backend netns.Backend
	// RedirectPort is the relay's listener port, used when a pod's installed table no
	// longer names it (every flow was decided in the kernel). 0: refuse such pods.
	RedirectPort uint16
	// NoWatch skips the conntrack watchers (install only; tests of the compiled tables).
	NoWatch bool
	// Now is the clock of the records (nil: time.Now).
	Now func() time.Time
}

// Pod is one registered workload.
type Pod struct {
	ID     string
	Netns  string
	Labels map[string]string // exactly what the relay hands Decide for this workload
	Image  string
	// Capture is the pod's capture program; nil reads it back from the table installed
	// in Netns (kl-cni or the OCI hook wrote it).
	Capture *netns.Capture
}

// PodStatus is what `kl-ctl status` shows of a pod's fast path.
type PodStatus struct {
	ID         string   `json:"id"`
	Share      float64  `json:"kernel_share"`   // fraction of the plan's entries decided in the kernel
	Entries    int      `json:"entries"`        // plan entries (the guard excluded)
	Kernel     int      `json:"kernel_entries"` // of which the kernel decides
	AllKernel  bool     `json:"all_kernel"`     // no flow of the pod reaches the relay
	Flows      uint64   `json:"kernel_flows"`   // kernel-decided flows recorded
	Lost       uint64   `json:"lost_events"`    // conntrack event socket failures (the watcher reopened it; events may be lost)
	Overruns   uint64   `json:"event_overruns"` // event socket overruns (the kernel resends the NEW events: late, not lost)
	Unknown    uint64   `json:"unknown_marks"`  // tagged marks of no known generation
	Late       uint64   `json:"late_records"`   // recorded from a DESTROY event (the NEW event could not be delivered in time)
	Generation uint8    `json:"generation"`
	Policy     string   `json:"policy"` // hash of the policy the plan was computed from
	Error      string   `json:"error,omitempty"`
	Plan       []string `json:"plan,omitempty"` // the entries, in words
}

// Manager keeps the fast path of every registered pod.
type Manager struct {
	o       Options
	log     *slog.Logger
	backend netns.Backend

	mu   sync.Mutex
	gen  uint8 // the last install round's generation
	pods map[string]*pod
	poll *poller // the pods' conntrack event sockets (Linux; started by the first watch)
	hits map[hitKey]uint64
}

type hitKey struct {
	rule int
	dim  string
}

type pod struct {
	Pod
	imu     sync.Mutex // one install at a time
	capture netns.Capture
	gen     uint8
	gens    map[uint8][]rules.KernelEntry // id tables by generation (entries by id-1)
	order   []uint8                       // generations in install order, oldest first
	plan    *rules.KernelPlan
	policy  string
	flows   uint64
	lost    uint64
	overrun uint64
	unknown uint64
	late    uint64
	err     string
	stop    func()
}

// New returns a Manager.
func New(o Options) *Manager {
	m := &Manager{o: o, log: o.Log, backend: o.Backend, pods: map[string]*pod{}, hits: map[hitKey]uint64{}}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.o.Now == nil {
		m.o.Now = time.Now
	}
	return m
}

// Add registers a pod: it installs the pod's kernel decisions under policy p and starts
// watching its conntrack events. Adding an id again replaces the registration. On error
// nothing of the pod is kept and its table is unchanged (the relay decides everything).
func (m *Manager) Add(pd Pod, p *rules.Policy) error {
	if pd.ID == "" || pd.Netns == "" {
		return errors.New("fastpath: pod id and netns path are required")
	}
	m.Remove(pd.ID)
	var c netns.Capture
	if pd.Capture != nil {
		c = *pd.Capture
	} else {
		got, err := m.installed(pd.Netns)
		if err != nil {
			return fmt.Errorf("fastpath: pod %s: %w", pd.ID, err)
		}
		c = got
		if c.RedirectPort == 0 {
			c.RedirectPort = m.o.RedirectPort
		}
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("fastpath: pod %s: %w", pd.ID, err)
	}
	// The pod's plan state exists before its table does, so no event can arrive for a
	// mark the manager does not know yet.
	po := &pod{Pod: pd, capture: c, gens: map[uint8][]rules.KernelEntry{}}
	m.mu.Lock()
	m.pods[pd.ID] = po
	m.mu.Unlock()
	if !m.o.NoWatch {
		stop, err := m.watch(po)
		if err != nil {
			m.mu.Lock()
			delete(m.pods, pd.ID)
			m.mu.Unlock()
			return fmt.Errorf("fastpath: pod %s: watch conntrack: %w", pd.ID, err)
		}
		po.stop = stop
	}
	if err := m.install(po, m.newRound(p)); err != nil {
		m.Remove(pd.ID)
		return err
	}
	return nil
}

// round is one install round (an Add, or a Reload across every pod): one generation,
// and plans and tables shared by the pods that have the same labels, image and capture.
type round struct {
	p      *rules.Policy
	gen    uint8
	mu     sync.Mutex
	plans  map[string]*rules.KernelPlan
	tables map[string]*netns.Table
}

func (m *Manager) newRound(p *rules.Policy) *round {
	m.mu.Lock()
	m.gen++
	gen := m.gen
	m.mu.Unlock()
	return &round{p: p, gen: gen, plans: map[string]*rules.KernelPlan{}, tables: map[string]*netns.Table{}}
}

// workloadKey identifies what a plan depends on besides the policy.
func workloadKey(labels map[string]string, image string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString(image)
	for _, k := range keys {
		fmt.Fprintf(&b, "\x00%s=%s", k, labels[k])
	}
	return b.String()
}

// table returns the plan and the compiled table of po in this round.
func (r *round) table(po *pod) (*rules.KernelPlan, *netns.Table, error) {
	wk := workloadKey(po.Labels, po.Image)
	r.mu.Lock()
	plan := r.plans[wk]
	r.mu.Unlock()
	if plan == nil {
		plan = r.p.Plan(po.Labels, po.Image)
		r.mu.Lock()
		r.plans[wk] = plan
		r.mu.Unlock()
	}
	tk := wk + "\x01" + po.capture.Render()
	r.mu.Lock()
	t := r.tables[tk]
	r.mu.Unlock()
	if t == nil {
		var err error
		if t, err = po.capture.ProgramWith(Compile(plan, r.gen)); err != nil {
			return nil, nil, err
		}
		r.mu.Lock()
		r.tables[tk] = t
		r.mu.Unlock()
	}
	return plan, t, nil
}

// install installs po's plan of this round. The id table of the new generation is
// published before the table goes in, and older generations stay decodable for a while,
// so every event finds the decision its mark was set by.
func (m *Manager) install(po *pod, r *round) error {
	po.imu.Lock()
	defer po.imu.Unlock()
	plan, t, err := r.table(po)
	if err != nil {
		return fmt.Errorf("fastpath: pod %s: %w", po.ID, err)
	}
	m.mu.Lock()
	po.gens[r.gen] = plan.Entries // shared, read-only
	po.order = slices.DeleteFunc(po.order, func(g uint8) bool { return g == r.gen })
	po.order = append(po.order, r.gen)
	for len(po.order) > keepGens {
		delete(po.gens, po.order[0])
		po.order = po.order[1:]
	}
	m.mu.Unlock()
	err = m.apply(po.Netns, t)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		po.err = err.Error()
		return fmt.Errorf("fastpath: pod %s: %w", po.ID, err)
	}
	po.gen, po.plan, po.policy, po.err = r.gen, plan, r.p.Hash(), ""
	m.log.Debug("kernel decisions installed", "pod", po.ID, "generation", r.gen, "entries", len(plan.Entries)-1, "kernel_share", plan.Share())
	return nil
}

// reloadWorkers is how many pods' tables are swapped at once during a Reload.
const reloadWorkers = 4

// Reload installs every pod's plan under the new policy, one atomic table swap per pod,
// with the plans and tables of identical pods computed once. A pod whose install fails
// keeps its previous table (and decisions) and reports the error in its status; the
// errors are returned joined.
func (m *Manager) Reload(p *rules.Policy) error {
	m.mu.Lock()
	pods := make([]*pod, 0, len(m.pods))
	for _, po := range m.pods {
		pods = append(pods, po)
	}
	m.mu.Unlock()
	r := m.newRound(p)
	work := make(chan *pod)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range min(reloadWorkers, len(pods)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for po := range work {
				if err := m.install(po, r); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for _, po := range pods {
		work <- po
	}
	close(work)
	wg.Wait()
	return errors.Join(errs...)
}

// Remove stops watching a pod. Its table is left as it is: kl-cni DEL (or the hook's
// poststop) removes it with the netns. Removing an unknown id does nothing.
func (m *Manager) Remove(id string) {
	m.mu.Lock()
	po := m.pods[id]
	delete(m.pods, id)
	m.mu.Unlock()
	if po != nil && po.stop != nil {
		po.stop()
	}
}

// Verify checks that a pod's table still holds exactly its capture and the kernel
// decisions last installed (a periodic check for the daemon: a hand edit, or a kl-cni
// ADD that reinstalled the plain capture, shows here).
func (m *Manager) Verify(id string) error {
	m.mu.Lock()
	po := m.pods[id]
	var plan *rules.KernelPlan
	var gen uint8
	if po != nil {
		plan, gen = po.plan, po.gen
	}
	m.mu.Unlock()
	if po == nil {
		return fmt.Errorf("fastpath: pod %s is not registered", id)
	}
	if plan == nil {
		return fmt.Errorf("fastpath: pod %s has no kernel decisions installed", id)
	}
	d := Compile(plan, gen)
	if m.backend == nil {
		return netns.VerifyDecisions(po.Netns, po.capture, d)
	}
	return netns.VerifyDecisionsWith(m.backend, po.Netns, po.capture, d)
}

// Close stops every watcher.
func (m *Manager) Close() error {
	m.mu.Lock()
	ids := make([]string, 0, len(m.pods))
	for id := range m.pods {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	for _, id := range ids {
		m.Remove(id)
	}
	m.closePoller()
	return nil
}

// registered reports whether po is (still) the registration of its id.
func (m *Manager) registered(po *pod) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pods[po.ID] == po
}

func (m *Manager) installed(ns string) (netns.Capture, error) {
	if m.backend == nil {
		return netns.Installed(ns)
	}
	return netns.InstalledWith(m.backend, ns)
}

func (m *Manager) apply(ns string, t *netns.Table) error {
	if m.backend == nil {
		return netns.InstallProgram(ns, t)
	}
	return netns.InstallProgramWith(m.backend, ns, t)
}

// record turns one conntrack NEW event's mark into an audit record. It reports whether
// the mark was a kernel decision of the pod.
func (m *Manager) record(po *pod, mark uint32) bool {
	gen, id, ok := splitMark(mark)
	if !ok {
		return false
	}
	m.mu.Lock()
	entries, known := po.gens[gen]
	if !known || id > len(entries) {
		po.unknown++
		m.mu.Unlock()
		return false
	}
	d := entries[id-1].Decision
	po.flows++
	m.hits[hitKey{d.Rule, d.Dimension.String()}]++
	m.mu.Unlock()
	if m.o.Sink != nil {
		m.o.Sink.Add(audit.Record{
			At: m.o.Now(), Rule: d.Rule, Priority: d.Priority, Dimension: d.Dimension.String(),
			Exit: d.Exit, Note: d.Note, Path: "kernel",
		})
	}
	return true
}

func (m *Manager) late(po *pod) {
	m.mu.Lock()
	po.late++
	m.mu.Unlock()
}

func (m *Manager) overrun(po *pod) {
	m.mu.Lock()
	po.overrun++
	m.mu.Unlock()
}

func (m *Manager) lost(po *pod, n uint64) {
	m.mu.Lock()
	po.lost += n
	m.mu.Unlock()
}

// Status returns every pod's fast-path status, sorted by id.
func (m *Manager) Status() []PodStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]PodStatus, 0, len(m.pods))
	for _, po := range m.pods {
		s := PodStatus{ID: po.ID, Flows: po.flows, Lost: po.lost, Overruns: po.overrun, Unknown: po.unknown, Late: po.late, Generation: po.gen, Policy: po.policy, Error: po.err}
		if po.plan != nil {
			s.Share = po.plan.Share()
			s.AllKernel = po.plan.AllKernel()
			s.Entries = len(po.plan.Entries) - 1
			for i := 1; i < len(po.plan.Entries); i++ {
				if !po.plan.Entries[i].Relay {
					s.Kernel++
				}
			}
			if len(po.plan.Entries) <= 32 {
				for i := range po.plan.Entries {
					s.Plan = append(s.Plan, po.plan.Entries[i].String())
				}
			}
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b PodStatus) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out
}

// Hits returns the number of kernel-decided flows per rule (rule 0 split by dimension:
// default, guard), sorted by rule then dimension.
func (m *Manager) Hits() []audit.Hit {
	m.mu.Lock()
	out := make([]audit.Hit, 0, len(m.hits))
	for k, v := range m.hits {
		out = append(out, audit.Hit{Rule: k.rule, Dimension: k.dim, Count: v})
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b audit.Hit) int {
		if a.Rule != b.Rule {
			return a.Rule - b.Rule
		}
		switch {
		case a.Dimension < b.Dimension:
			return -1
		case a.Dimension > b.Dimension:
			return 1
		}
		return 0
	})
	return out
}
