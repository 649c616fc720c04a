package k8s

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/kl-egress/kl/relayd/config"
	"github.com/kl-egress/kl/relayd/install"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/tests/testutil"
)

const namespace = "kl-system"

// objects holds every manifest, strictly decoded into its Kubernetes type.
type objects struct {
	namespaces      []*corev1.Namespace
	serviceAccounts map[string]*corev1.ServiceAccount
	configMaps      map[string]*corev1.ConfigMap
	secrets         map[string]*corev1.Secret
	services        []*corev1.Service
	daemonSets      []*appsv1.DaemonSet
	runtimeClasses  []*nodev1.RuntimeClass
}

// load decodes every document of every *.yaml file here with unknown fields refused, so
// a misspelt or misplaced key fails instead of being silently dropped by the API server.
func load(t *testing.T) *objects {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	o := &objects{serviceAccounts: map[string]*corev1.ServiceAccount{}, configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			var head struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			var obj any
			switch head.APIVersion + " " + head.Kind {
			case "v1 Namespace":
				v := &corev1.Namespace{}
				o.namespaces, obj = append(o.namespaces, v), v
			case "v1 ServiceAccount":
				obj = &corev1.ServiceAccount{}
			case "v1 ConfigMap":
				obj = &corev1.ConfigMap{}
			case "v1 Secret":
				obj = &corev1.Secret{}
			case "v1 Service":
				v := &corev1.Service{}
				o.services, obj = append(o.services, v), v
			case "apps/v1 DaemonSet":
				v := &appsv1.DaemonSet{}
				o.daemonSets, obj = append(o.daemonSets, v), v
			case "node.k8s.io/v1 RuntimeClass":
				v := &nodev1.RuntimeClass{}
				o.runtimeClasses, obj = append(o.runtimeClasses, v), v
			default:
				t.Fatalf("%s document %d: unexpected %s %s", f, i, head.APIVersion, head.Kind)
			}
			// As the API server's strict field validation: duplicate keys refused, then
			// case-sensitive decoding with unknown and duplicate fields refused
			// (encoding/json alone would take "hostPid" for "hostPID").
			js, err := yaml.YAMLToJSONStrict([]byte(doc))
			if err != nil {
				t.Fatalf("%s document %d (%s): %v", f, i, head.Kind, err)
			}
			strict, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
			if err != nil {
				t.Fatalf("%s document %d (%s): %v", f, i, head.Kind, err)
			}
			if len(strict) > 0 {
				t.Fatalf("%s document %d (%s): %v", f, i, head.Kind, strict)
			}
			switch v := obj.(type) {
			case *corev1.ServiceAccount:
				o.serviceAccounts[v.Name] = v
			case *corev1.ConfigMap:
				o.configMaps[v.Name] = v
			case *corev1.Secret:
				o.secrets[v.Name] = v
			}
		}
	}
	return o
}

func stripComments(doc string) string {
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(doc))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func (o *objects) daemonSet(t *testing.T) (*appsv1.DaemonSet, *corev1.Container, *corev1.Container) {
	t.Helper()
	if len(o.daemonSets) != 1 {
		t.Fatalf("%d DaemonSets, want 1", len(o.daemonSets))
	}
	ds := o.daemonSets[0]
	var relay, cni *corev1.Container
	for i := range ds.Spec.Template.Spec.Containers {
		c := &ds.Spec.Template.Spec.Containers[i]
		switch c.Name {
		case "kl-relayd":
			relay = c
		case "install-cni":
			cni = c
		}
	}
	if relay == nil || cni == nil {
		t.Fatal("the DaemonSet needs the containers kl-relayd and install-cni")
	}
	return ds, relay, cni
}

func TestObjectsFitTogether(t *testing.T) {
	o := load(t)
	if len(o.namespaces) != 1 || o.namespaces[0].Name != namespace {
		t.Fatalf("want exactly the namespace %s", namespace)
	}
	if o.namespaces[0].Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Error("kl-system must allow host namespaces (pod-security enforce=privileged)")
	}
	ds, _, _ := o.daemonSet(t)
	spec := ds.Spec.Template.Spec

	named := []string{ds.Namespace}
	for _, s := range o.services {
		named = append(named, s.Namespace)
	}
	for _, m := range o.configMaps {
		named = append(named, m.Namespace)
	}
	for _, s := range o.secrets {
		named = append(named, s.Namespace)
	}
	for _, s := range o.serviceAccounts {
		named = append(named, s.Namespace)
	}
	for _, n := range named {
		if n != namespace {
			t.Errorf("object in namespace %q, want %s", n, namespace)
		}
	}

	sel := ds.Spec.Selector.MatchLabels
	if !subset(sel, ds.Spec.Template.Labels) {
		t.Errorf("selector %v does not match the template's labels %v", sel, ds.Spec.Template.Labels)
	}
	for _, s := range o.services {
		if !subset(s.Spec.Selector, ds.Spec.Template.Labels) {
			t.Errorf("service %s selects %v, not the node pods %v", s.Name, s.Spec.Selector, ds.Spec.Template.Labels)
		}
	}
	sa, ok := o.serviceAccounts[spec.ServiceAccountName]
	if !ok {
		t.Errorf("service account %q is not defined", spec.ServiceAccountName)
	} else if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Error("the node pods need no API token: automountServiceAccountToken must be false")
	}

	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
		if v.ConfigMap != nil && o.configMaps[v.ConfigMap.Name] == nil {
			t.Errorf("volume %s: ConfigMap %s is not defined", v.Name, v.ConfigMap.Name)
		}
		if v.Secret != nil && o.secrets[v.Secret.SecretName] == nil {
			t.Errorf("volume %s: Secret %s is not defined", v.Name, v.Secret.SecretName)
		}
	}
	used := map[string]bool{}
	for _, c := range spec.Containers {
		for _, m := range c.VolumeMounts {
			if _, ok := vols[m.Name]; !ok {
				t.Errorf("container %s mounts undefined volume %s", c.Name, m.Name)
			}
			used[m.Name] = true
		}
	}
	for n := range vols {
		if !used[n] {
			t.Errorf("volume %s is never mounted", n)
		}
	}
	if len(o.runtimeClasses) != 1 || o.runtimeClasses[0].Handler != "kl" {
		t.Error("want one RuntimeClass with handler kl (the runtime name kl-ctl install containerd adds)")
	}
}

// The relay container gets exactly the capabilities of the systemd unit, and the pod
// the host namespaces it needs, and nothing else.
func TestRelayPrivileges(t *testing.T) {
	o := load(t)
	ds, relay, cni := o.daemonSet(t)
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || !spec.HostPID {
		t.Error("kl-relayd needs hostNetwork (API socket on the host, gateway exit) and hostPID (/proc/PID of containers)")
	}
	if spec.HostIPC {
		t.Error("hostIPC is not needed")
	}
	unitCaps := unitCapabilities(t)
	for _, c := range []*corev1.Container{relay, cni} {
		sc := c.SecurityContext
		if sc == nil || sc.Capabilities == nil {
			t.Fatalf("%s: no securityContext.capabilities", c.Name)
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("%s must not be privileged", c.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: allowPrivilegeEscalation must be false", c.Name)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: readOnlyRootFilesystem must be true", c.Name)
		}
		if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("%s drops %v, want ALL", c.Name, sc.Capabilities.Drop)
		}
	}
	var got []string
	for _, c := range relay.SecurityContext.Capabilities.Add {
		got = append(got, "CAP_"+string(c))
	}
	sort.Strings(got)
	if !slices.Equal(got, unitCaps) {
		t.Errorf("kl-relayd adds %v, the systemd unit allows %v: keep them the same", got, unitCaps)
	}
	if len(cni.SecurityContext.Capabilities.Add) != 0 {
		t.Errorf("install-cni adds %v; it needs none", cni.SecurityContext.Capabilities.Add)
	}

	mounts := map[string]corev1.VolumeMount{}
	for _, m := range relay.VolumeMounts {
		mounts[m.MountPath] = m
	}
	if m, ok := mounts["/var/run/netns"]; !ok || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer {
		t.Error("/var/run/netns must be mounted with HostToContainer propagation (pod netns mounts appear after start)")
	}
	if m, ok := mounts["/run/kl"]; !ok || hostPath(spec, m.Name) != "/run/kl" {
		t.Error("/run/kl (the API socket) must be the host's /run/kl, where kl-cni connects")
	}
}

// Rules arrive live (a directory mount, never subPath) and the commands point into the
// mounts; the settings Secret is root-only.
func TestConfigMounts(t *testing.T) {
	o := load(t)
	ds, relay, cni := o.daemonSet(t)
	spec := ds.Spec.Template.Spec
	flags := map[string]string{}
	for _, a := range relay.Command[1:] {
		k, v, _ := strings.Cut(a, "=")
		flags[k] = v
	}
	for flag, volume := range map[string]string{"--config": "rules", "--settings": "settings"} {
		var m *corev1.VolumeMount
		for i := range relay.VolumeMounts {
			if relay.VolumeMounts[i].Name == volume {
				m = &relay.VolumeMounts[i]
			}
		}
		if m == nil {
			t.Fatalf("kl-relayd does not mount %s", volume)
		}
		if m.SubPath != "" {
			t.Errorf("%s is mounted with subPath: such mounts never receive updates", volume)
		}
		if !strings.HasPrefix(flags[flag], m.MountPath+"/") {
			t.Errorf("kl-relayd %s=%s is not inside the %s mount %s", flag, flags[flag], volume, m.MountPath)
		}
	}
	for _, v := range spec.Volumes {
		if v.Name == "settings" && (v.Secret == nil || v.Secret.DefaultMode == nil || *v.Secret.DefaultMode != 0o400) {
			t.Error("the settings Secret must be mounted mode 0400 (the daemon refuses readable credentials)")
		}
	}
	cniFlags := map[string]string{}
	for _, a := range cni.Command[1:] {
		k, v, _ := strings.Cut(a, "=")
		cniFlags[k] = v
	}
	for flag, host := range map[string]string{"--cni-conf-dir": "/etc/cni/net.d", "--cni-bin-dir": "/opt/cni/bin"} {
		found := false
		for _, m := range cni.VolumeMounts {
			if m.MountPath == cniFlags[flag] && hostPath(spec, m.Name) == host {
				found = true
			}
		}
		if !found {
			t.Errorf("install-cni %s=%s is not the host's %s", flag, cniFlags[flag], host)
		}
	}
}

// install-cni leaves kl-cni in the conflist when it terminates: a pod created while the
// entry is missing (during a rolling update) would run uncaptured for life, while with the
// entry in place its CNI ADD fails closed until the relay is back.
func TestInstallCNIKeepsEntry(t *testing.T) {
	o := load(t)
	ds, _, cni := o.daemonSet(t)
	// docs/install.md's uninstall adds --uninstall-on-exit to containers/0.
	if ds.Spec.Template.Spec.Containers[0].Name != "install-cni" {
		t.Error("install-cni must stay the first container: docs/install.md patches containers/0")
	}
	watch := false
	for _, a := range cni.Command {
		if strings.HasPrefix(a, "--uninstall-on-exit") {
			t.Errorf("install-cni runs with %s: the conflist briefly lacks kl-cni on every restart, and pods created then are never captured", a)
		}
		watch = watch || a == "--watch"
	}
	if !watch {
		t.Error("install-cni must run with --watch (the network plugin rewrites its conflist)")
	}
}

// install-cni is ready only while kl-cni is chained: its readiness probe is kl-ctl's
// `install cni --check`, a binary of the image, with install-cni's own directories and
// settings. Run for real (the built kl-ctl and kl-cni, temporary directories in place
// of the host's), it passes on a node whose conflist chains kl-cni and fails on one
// where kl-cni cannot be chained (Multus's single-plugin .conf sorts first), so such a
// node's kl pod is not ready and a rollout does not pass it.
func TestInstallCNIReadiness(t *testing.T) {
	o := load(t)
	_, _, cni := o.daemonSet(t)
	p := cni.ReadinessProbe
	if p == nil || p.Exec == nil || len(p.Exec.Command) < 4 {
		t.Fatal("install-cni has no exec readinessProbe: a node where kl-cni cannot be chained would look ready and its pods start uncaptured")
	}
	probe := p.Exec.Command
	image := imageFiles(t)
	for _, bin := range []string{cni.Command[0], probe[0]} {
		if !image[bin] {
			t.Errorf("%s is not in the image (packaging/k8s/Dockerfile)", bin)
		}
	}
	if filepath.Base(probe[0]) != "kl-ctl" || !slices.Equal(probe[1:4], []string{"install", "cni", "--check"}) {
		t.Fatalf("install-cni's readiness probe is %q, want kl-ctl install cni --check", probe)
	}
	flags := func(args []string) map[string]string {
		m := map[string]string{}
		for _, a := range args {
			k, v, _ := strings.Cut(a, "=")
			m[k] = v
		}
		return m
	}
	want, got := flags(cni.Command[1:]), flags(probe[4:])
	for _, f := range []string{"--cni-conf-dir", "--cni-bin-dir", "--conf"} {
		if got[f] != want[f] {
			t.Errorf("readiness probe %s=%q, install-cni runs with %q: check what it installs", f, got[f], want[f])
		}
	}

	dir := t.TempDir()
	host := map[string]string{want["--cni-conf-dir"]: filepath.Join(dir, "net.d"), want["--cni-bin-dir"]: filepath.Join(dir, "bin")}
	for _, d := range host {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	netd, bin := host[want["--cni-conf-dir"]], host[want["--cni-bin-dir"]]
	if _, err := install.CopyBinary(testutil.Bin(t, "kl-cni"), bin, install.DefaultCNIType); err != nil {
		t.Fatal(err)
	}
	entry := install.CNI{}
	if c := want["--conf"]; c != "" {
		if err := json.Unmarshal([]byte(c), &entry.Conf); err != nil {
			t.Fatalf("install-cni --conf: %v", err)
		}
	}
	chained, err := entry.Install([]byte(`{"cniVersion": "1.0.0", "name": "k8s-pod-network", "plugins": [{"type": "ptp"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(netd, "10-ptp.conflist"), chained, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{}
	for _, a := range probe[1:] {
		k, v, ok := strings.Cut(a, "=")
		if d, mapped := host[v]; ok && mapped {
			a = k + "=" + d
		}
		args = append(args, a)
	}
	kl := testutil.Bin(t, "kl-ctl")
	if out, err := exec.Command(kl, args...).CombinedOutput(); err != nil {
		t.Errorf("readiness probe on a node with kl-cni chained: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(netd, "00-multus.conf"), []byte(`{"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "multus"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(kl, args...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "single-plugin") {
		t.Errorf("readiness probe on a node whose 00-multus.conf cannot chain kl-cni: %v, want a failure saying why\n%s", err, out)
	}
}

// imageFiles reads the paths the image's Dockerfile copies files to.
func imageFiles(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]bool{}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || f[0] != "COPY" {
			continue
		}
		dst := f[len(f)-1]
		for _, src := range f[1 : len(f)-1] {
			if strings.HasSuffix(dst, "/") {
				files[dst+filepath.Base(src)] = true
			} else {
				files[dst] = true
			}
		}
	}
	return files
}

// The ConfigMap's rules and the Secret's settings load as the daemon loads them, and
// the metrics port agrees everywhere Prometheus looks for it.
func TestConfigContents(t *testing.T) {
	o := load(t)
	ds, relay, _ := o.daemonSet(t)
	rulesData := o.configMaps["kl-rules"].Data["rules.yaml"]
	if _, err := rules.Parse("kl-rules/rules.yaml", []byte(rulesData), rules.LoadOptions{}); err != nil {
		t.Errorf("ConfigMap kl-rules: %v", err)
	}
	cfg, err := config.Parse("kl-relayd/relayd.yaml", []byte(o.secrets["kl-relayd"].StringData["relayd.yaml"]))
	if err != nil {
		t.Fatalf("Secret kl-relayd: %v", err)
	}
	_, port, err := net.SplitHostPort(cfg.Metrics)
	if err != nil {
		t.Fatalf("metrics %q: %v", cfg.Metrics, err)
	}
	ann := ds.Spec.Template.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != port || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("prometheus annotations %v do not match metrics %s", ann, cfg.Metrics)
	}
	var cport string
	for _, p := range relay.Ports {
		if p.Name == "metrics" {
			cport = itoa(p.ContainerPort)
		}
	}
	if cport != port {
		t.Errorf("container port metrics = %s, settings say %s", cport, port)
	}
	for _, s := range o.services {
		for _, p := range s.Spec.Ports {
			if itoa(p.Port) != port {
				t.Errorf("service %s port %d, metrics on %s", s.Name, p.Port, port)
			}
		}
	}
}

// The relay's command line works: kl-relayd check with the Secret and ConfigMap
// contents in place of the mounts.
func TestRelayCommand(t *testing.T) {
	o := load(t)
	_, relay, _ := o.daemonSet(t)
	dir := t.TempDir()
	settings := o.secrets["kl-relayd"].StringData["relayd.yaml"] + "socket: " + dir + "/relayd.sock\nstateDir: " + dir + "/state\n"
	files := map[string]string{"/etc/kl/settings/relayd.yaml": settings, "/etc/kl/rules/rules.yaml": o.configMaps["kl-rules"].Data["rules.yaml"]}
	args := []string{"check"}
	for _, a := range relay.Command[1:] {
		k, v, _ := strings.Cut(a, "=")
		if content, ok := files[v]; ok {
			v = filepath.Join(dir, filepath.Base(v))
			if err := os.WriteFile(v, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		args = append(args, k+"="+v)
	}
	out, err := exec.Command(testutil.Bin(t, "kl-relayd"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("kl-relayd %v: %v\n%s", args, err, out)
	}
}

func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func hostPath(spec corev1.PodSpec, volume string) string {
	for _, v := range spec.Volumes {
		if v.Name == volume && v.HostPath != nil {
			return v.HostPath.Path
		}
	}
	return ""
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// unitCapabilities reads CapabilityBoundingSet from the systemd unit, sorted.
func unitCapabilities(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../systemd/kl-relayd.service")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CapabilityBoundingSet=(.*)$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("no CapabilityBoundingSet in the unit")
	}
	caps := strings.Fields(string(m[1]))
	sort.Strings(caps)
	return caps
}
