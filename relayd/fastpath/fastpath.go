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

// The conntrack mark of a kernel-decided connection: Tag in the top byte, the
// generation of the pod's table that set it in the next, the decision's id (its entry
// index + 1 in the plan) in the low 16 bits. Marks without the tag are not kl's kernel
// decisions (the relay's own connections carry none).
//
// A generation names one id table of one pod, so it must never name two while a mark of
// the first may still come: eight bits wrap after 256 install rounds (a round is every
// Add and every Reload on the node), and a pod that failed a reload, or that still has
// events of older tables queued, must not see its number reused. Each install therefore
// takes the round's number unless the pod still knows that number (its installed table's
// or one of the keepGens kept for late events), and then the next one it does not know
// (pod.genFor). At most keepGens numbers are known, so one is always free; the mark keeps
// its layout, and pods installed in the same round still share one compiled table.
//
// The counter is the process's own, but a pod's table outlives the process: after a
// restart the previous kl-relayd's table goes on deciding flows until the new one is
// installed, and the new watcher, opened first, reads their events. A generation says
// nothing of which process's id table it names, so a pod added with a table already in
// place learns the generations of that table's marks (netns.InstalledMarks) as known
// numbers without an id table: its own tables never take them, and their events count
// as unknown marks instead of being decoded with another table's ids (pod.adopt). The
// node's counter also goes on from the latest of them, so the numbers the previous
// process used last are the ones this one reuses last.
const (
	Tag      uint32 = 0x6b000000
	TagMask  uint32 = 0xff000000
	genShift        = 16
	idMask   uint32 = 0xffff
	// MaxEntries is how many plan entries can carry their own mark; entries past it
	// (only in plans of more than 65535 rules) go to the relay, which decides them alike.
	MaxEntries = int(idMask)
	// keepGens is how many generations of a pod's id table are kept (the installed one
	// and those before it), so that a connection marked just before a reload is still
	// recorded with its own decision.
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
	Unknown    uint64   `json:"unknown_marks"`  // tagged marks of no known generation, or of a table installed before the pod was added
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

	mu    sync.Mutex
	gen   uint8 // the last install round's generation (node-wide; a pod may skip it)
	began bool  // a round has taken a generation, or gen follows an adopted table's
	pods  map[string]*pod
	poll  *poller // the pods' conntrack event sockets (Linux; started by the first watch)
	hits  map[hitKey]uint64
}

type hitKey struct {
	rule int
	dim  string
}

// pod is one registered pod. Pod (netns path, labels, image) and capture change only
// with imu and the manager's mu held: installs read them under imu, everything else
// copies them under mu. The rest is under mu, but for what is set before the pod is
// published (ID, stop, nsDev, nsIno).
type pod struct {
	Pod
	imu     sync.Mutex // one install at a time
	capture netns.Capture
	gen     uint8                         // of the installed table (when plan is set)
	gens    map[uint8][]rules.KernelEntry // id tables by generation (entries by id-1); nil: adopted, ids unknown
	order   []uint8                       // installed (and adopted) generations, oldest first; the last is gen
	plan    *rules.KernelPlan
	policy  string
	flows   uint64
	lost    uint64
	overrun uint64
	unknown uint64
	late    uint64
	err     string // of the last install, when it failed
	gone    bool   // dropped: no longer registered, its watcher stopped
	adopted bool   // an event of an adopted generation was seen (logged once)
	// Set before the pod is published, never changed after (read without a lock).
	stop  func() // nil: not watched
	nsDev uint64 // the netns the watcher reads (watch_linux.go)
	nsIno uint64
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
// watching its conntrack events. On error nothing of the pod is kept and its table is
// unchanged (the relay decides everything), with one exception: a pod already
// registered under the id stays, with its watcher, when the new path cannot be opened
// (a path that has gone says nothing of the netns, which may live on under another
// path, deciding flows with the pod's table: see the daemon's sweep); Remove ends it.
//
// The generations the table already in the pod's netns marks with (the previous
// kl-relayd's, after a restart) are never decoded: their events count as unknown marks
// (see Tag).
//
// Adding an id again in the same netns (a refresh, the daemon's repair) updates the pod
// in place: its watcher stays, with whatever events are queued in it, and so do the
// generations it knows, so flows of its earlier tables are still recorded with their own
// decisions. If that install fails the pod stays as it was (its previous table is still
// in place and watched) with the error in its status, and Verify fails until an install
// succeeds. The same netns (device and inode) under another path (kl-hook re-registers
// a netns shared by containers through another member's /proc/<pid>/ns/net, a bind
// mount moved) is a move: the pod takes the new path, and its table stays as it is when
// nothing it depends on changed (labels, image, capture, policy) and it still holds the
// pod's decisions; otherwise it is installed as for a refresh (a Manager with NoWatch
// knows a netns by its path only: another path replaces the registration). Adding an id
// in another netns replaces the registration. Of concurrent Adds of one id, the last to register
// its pod stays; the watchers of the others are stopped.
func (m *Manager) Add(pd Pod, p *rules.Policy) error {
	if pd.ID == "" || pd.Netns == "" {
		return errors.New("fastpath: pod id and netns path are required")
	}
	m.mu.Lock()
	old := m.pods[pd.ID]
	var path string
	if old != nil {
		path = old.Netns
	}
	m.mu.Unlock()
	if old != nil && (path == pd.Netns && m.o.NoWatch || old.inNetns(pd.Netns)) {
		return m.update(old, pd, p, path != pd.Netns)
	}
	if old != nil && !m.o.NoWatch {
		if err := reachable(pd.Netns); err != nil {
			return fmt.Errorf("fastpath: pod %s: %w", pd.ID, err)
		}
	}
	if old != nil {
		m.drop(old)
	}
	c, err := m.captureOf(pd)
	if err != nil {
		return err
	}
	// The pod's plan state exists before its table does, so no event can arrive for a
	// mark the manager does not know yet. Its watcher (and the netns identity it keeps)
	// is set before the pod is published, and never changes after.
	po := &pod{Pod: pd, capture: c, gens: map[uint8][]rules.KernelEntry{}}
	m.adopt(po)
	if !m.o.NoWatch {
		stop, err := m.watch(po)
		if err != nil {
			return fmt.Errorf("fastpath: pod %s: watch conntrack: %w", pd.ID, err)
		}
		po.stop = stop
	}
	// An Add of the same id that published its pod meanwhile is replaced by this one.
	m.mu.Lock()
	prev := m.pods[pd.ID]
	m.pods[pd.ID] = po
	m.mu.Unlock()
	if prev != nil {
		m.drop(prev)
	}
	po.imu.Lock()
	err = m.install(po, m.newRound(p))
	po.imu.Unlock()
	if err != nil {
		m.drop(po)
		return err
	}
	return nil
}

// update is Add of a registered pod in the same netns; moved says it comes under
// another path.
func (m *Manager) update(po *pod, pd Pod, p *rules.Policy, moved bool) error {
	po.imu.Lock()
	defer po.imu.Unlock()
	// The path, labels and image are the registration's from now on, even if this
	// install fails: a Reload meanwhile must compute the plan of the workload as it is, in
	// the netns under the path that still names it (the old one may be gone).
	m.mu.Lock()
	keep := moved && po.plan != nil && po.err == "" && po.policy == p.Hash() &&
		workloadKey(po.Labels, po.Image) == workloadKey(pd.Labels, pd.Image)
	was := po.capture
	po.Netns, po.Labels, po.Image = pd.Netns, pd.Labels, pd.Image
	m.mu.Unlock()
	fail := func(err error) error {
		m.mu.Lock()
		po.err = err.Error()
		m.mu.Unlock()
		return err
	}
	if !m.o.NoWatch {
		if err := m.rewatch(po); err != nil {
			return fail(fmt.Errorf("fastpath: pod %s: watch conntrack: %w", po.ID, err))
		}
	}
	c, err := m.captureOf(pd)
	if err != nil {
		return fail(err)
	}
	m.mu.Lock()
	po.Capture, po.capture = pd.Capture, c
	m.mu.Unlock()
	// A move alone changes nothing the table depends on: it stays (with its generation,
	// and the counters of its rules) when it still holds exactly the pod's decisions.
	if keep && c.Render() == was.Render() && m.verify(pd.Netns, c, Compile(po.plan, po.gen)) == nil {
		m.log.Debug("kernel decisions kept under the pod's new netns path", "pod", po.ID, "netns", pd.Netns)
		return nil
	}
	if err := m.install(po, m.newRound(p)); err != nil {
		return fail(err)
	}
	return nil
}

// captureOf returns the capture program of pd: its own, or the one installed in its netns.
func (m *Manager) captureOf(pd Pod) (netns.Capture, error) {
	var c netns.Capture
	if pd.Capture != nil {
		c = *pd.Capture
	} else {
		got, err := m.installed(pd.Netns)
		if err != nil {
			return c, fmt.Errorf("fastpath: pod %s: %w", pd.ID, err)
		}
		c = got
		if c.RedirectPort == 0 {
			c.RedirectPort = m.o.RedirectPort
		}
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("fastpath: pod %s: %w", pd.ID, err)
	}
	return c, nil
}

// round is one install round (an Add, or a Reload across every pod): one generation
// (which a pod skips if it still knows it, see genFor), and plans and tables shared by the
// pods that have the same labels, image, capture and generation.
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
	m.began = true
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

// table returns the plan and the compiled table of po in this round, marking with gen.
func (r *round) table(po *pod, gen uint8) (*rules.KernelPlan, *netns.Table, error) {
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
	tk := wk + "\x01" + po.capture.Render() + "\x01" + string(rune(gen))
	r.mu.Lock()
	t := r.tables[tk]
	r.mu.Unlock()
	if t == nil {
		var err error
		if t, err = po.capture.ProgramWith(Compile(plan, gen)); err != nil {
			return nil, nil, err
		}
		r.mu.Lock()
		r.tables[tk] = t
		r.mu.Unlock()
	}
	return plan, t, nil
}

// adopt makes the generations of the table installed in po's netns known to po without
// an id table (po not published yet): that table was installed by another process (the
// kl-relayd before a restart) or for a registration this process dropped, and it decides
// the pod's flows until po's own table is in. Its marks' ids mean nothing here, so their
// events count as unknown marks, and po's own tables take other numbers (genFor). At
// most keepGens-1 are kept, so that genFor always finds a free number. The node's
// counter goes on after them: a restarted daemon continues the previous one's numbers,
// so those it used last (marks of connections whose events come late) come round last.
func (m *Manager) adopt(po *pod) {
	marks, err := m.installedMarks(po.Netns)
	if err != nil {
		// No table to read: nothing installed decides the pod's flows, or installing fails too.
		m.log.Debug("marks of the installed table not read", "pod", po.ID, "err", err)
		return
	}
	for _, mark := range marks {
		gen, _, ok := splitMark(mark)
		if !ok || slices.Contains(po.order, gen) || len(po.order) == keepGens-1 {
			continue
		}
		po.gens[gen] = nil
		po.order = append(po.order, gen)
		m.mu.Lock()
		if !m.began || int8(gen-m.gen) > 0 {
			m.gen, m.began = gen, true
		}
		m.mu.Unlock()
	}
}

// genFor returns the generation po's next table marks with: the round's, or the next
// number after it that po does not know (po.imu held). A known number may still be on
// marks: of the installed table, or of connections whose events are queued or late.
func (po *pod) genFor(r *round) uint8 {
	g := r.gen
	for slices.Contains(po.order, g) {
		g++
	}
	return g
}

// install installs po's plan of this round (po.imu held). The id table of the new
// generation is published before the table goes in (its first connections' events may
// be read before apply returns), and the generation is kept only once its table is in:
// a failed install leaves the pod's generations as they were, so the installed table's
// is never evicted. Older generations stay decodable for keepGens installs, so every
// event finds the decision its mark was set by.
func (m *Manager) install(po *pod, r *round) error {
	gen := po.genFor(r)
	plan, t, err := r.table(po, gen)
	if err != nil {
		err = fmt.Errorf("fastpath: pod %s: %w", po.ID, err)
		m.mu.Lock()
		po.err = err.Error()
		m.mu.Unlock()
		return err
	}
	m.mu.Lock()
	po.gens[gen] = plan.Entries // shared, read-only
	m.mu.Unlock()
	err = m.apply(po.Netns, t)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		// The transaction did not commit: no mark of gen exists.
		delete(po.gens, gen)
		po.err = err.Error()
		return fmt.Errorf("fastpath: pod %s: %w", po.ID, err)
	}
	po.order = append(po.order, gen)
	for len(po.order) > keepGens {
		delete(po.gens, po.order[0])
		po.order = po.order[1:]
	}
	po.gen, po.plan, po.policy, po.err = gen, plan, r.p.Hash(), ""
	m.log.Debug("kernel decisions installed", "pod", po.ID, "generation", gen, "entries", len(plan.Entries)-1, "kernel_share", plan.Share())
	return nil
}

// reloadWorkers is how many pods' tables are swapped at once during a Reload.
const reloadWorkers = 4

// Reload installs every pod's plan under the new policy, one atomic table swap per pod,
// with the plans and tables of identical pods computed once. A pod whose install fails
// keeps its previous table (and decisions) and reports the error in its status, and
// Verify under p fails for it until an Add (the daemon's repair) installs p's decisions;
// the errors are returned joined.
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
				po.imu.Lock()
				err := m.install(po, r)
				po.imu.Unlock()
				if err != nil {
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

// Remove stops watching a pod, after recording the events already queued for it. Its
// table is left as it is: kl-cni DEL (or the hook's poststop) removes it with the netns.
// Removing an unknown id does nothing.
func (m *Manager) Remove(id string) {
	m.mu.Lock()
	po := m.pods[id]
	m.mu.Unlock()
	if po != nil {
		m.drop(po)
	}
}

// drop ends po's registration, if it is still its id's, and stops its watcher after
// recording the events queued in it. A pod is dropped once: later calls do nothing.
func (m *Manager) drop(po *pod) {
	m.mu.Lock()
	if m.pods[po.ID] == po {
		delete(m.pods, po.ID)
	}
	was := po.gone
	po.gone = true
	m.mu.Unlock()
	if !was && po.stop != nil {
		po.stop()
	}
}

// Verify checks that a pod's kernel decisions are those of policy p (the live one) and
// that its table still holds exactly its capture and those decisions: a periodic check
// for the daemon, which adds the pod again when it fails. A failed install (a Reload's
// table swap that left the previous policy's decisions in place), a hand edit, or a
// kl-cni ADD that reinstalled the plain capture shows here.
func (m *Manager) Verify(id string, p *rules.Policy) error {
	m.mu.Lock()
	po := m.pods[id]
	var (
		plan        *rules.KernelPlan
		gen         uint8
		policy, bad string
		ns          string
		c           netns.Capture
	)
	if po != nil {
		plan, gen, policy, bad, ns, c = po.plan, po.gen, po.policy, po.err, po.Netns, po.capture
	}
	m.mu.Unlock()
	switch {
	case po == nil:
		return fmt.Errorf("fastpath: pod %s is not registered", id)
	case bad != "":
		return fmt.Errorf("fastpath: pod %s: last install failed: %s", id, bad)
	case plan == nil:
		return fmt.Errorf("fastpath: pod %s has no kernel decisions installed", id)
	case policy != p.Hash():
		return fmt.Errorf("fastpath: pod %s has the kernel decisions of policy %.12s, not of the live %.12s", id, policy, p.Hash())
	}
	return m.verify(ns, c, Compile(plan, gen))
}

// verify checks that the table in ns holds exactly capture c with decisions d.
func (m *Manager) verify(ns string, c netns.Capture, d netns.Decisions) error {
	if m.backend == nil {
		return netns.VerifyDecisions(ns, c, d)
	}
	return netns.VerifyDecisionsWith(m.backend, ns, c, d)
}

// Stale returns the ids of the pods whose kernel decisions are not those of policy p
// (a Reload's install failed for them) or whose last install failed, sorted: what the
// daemon installs again when a reload finds the rules unchanged.
func (m *Manager) Stale(p *rules.Policy) []string {
	h := p.Hash()
	m.mu.Lock()
	var ids []string
	for id, po := range m.pods {
		if po.err != "" || po.policy != h {
			ids = append(ids, id)
		}
	}
	m.mu.Unlock()
	slices.Sort(ids)
	return ids
}

// Close stops every watcher, after recording the events queued in it.
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

// registered returns po's netns path, and whether po is still registered (not dropped;
// it may not be published yet).
func (m *Manager) registered(po *pod) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return po.Netns, !po.gone
}

func (m *Manager) installed(ns string) (netns.Capture, error) {
	if m.backend == nil {
		return netns.Installed(ns)
	}
	return netns.InstalledWith(m.backend, ns)
}

func (m *Manager) installedMarks(ns string) ([]uint32, error) {
	if m.backend == nil {
		return netns.InstalledMarks(ns)
	}
	return netns.InstalledMarksWith(m.backend, ns)
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
		first := known && entries == nil && !po.adopted
		po.adopted = po.adopted || first
		m.mu.Unlock()
		if first {
			m.log.Info("kernel-decided flows of the table found in the pod's netns (the previous kl-relayd's, until this one's went in) are counted as unknown marks, not recorded: which rules decided them is not known",
				"pod", po.ID, "generation", gen)
		}
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

// ResetHits starts the counts of Hits again (other rules loaded).
func (m *Manager) ResetHits() {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.hits)
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
