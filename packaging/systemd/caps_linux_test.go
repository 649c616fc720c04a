package systemd

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/kl-egress/kl/tests/testutil"
)

// The operations kl-relayd performs that need privileges, each tried by a helper
// process that runs as root with a reduced capability bounding set, as systemd starts
// the daemon. The target is a process of another user (containers mostly are).
var capsSteps = []string{"setns", "listen-in-netns", "nftables", "so_mark", "proc-ns-open", "proc-exe", "proc-fd"}

// needs says which step proves each capability of the unit is needed.
var needs = map[string][]string{
	"CAP_NET_ADMIN":       {"nftables", "so_mark"},
	"CAP_SYS_ADMIN":       {"setns"},
	"CAP_SYS_PTRACE":      {"proc-ns-open", "proc-exe"},
	"CAP_DAC_READ_SEARCH": {"proc-fd"},
}

// TestCapabilitiesNeededAndSufficient runs the helper with exactly the unit's
// CapabilityBoundingSet (every step must pass), then with each capability taken away
// (the steps that justify it in the unit's comments must fail).
func TestCapabilitiesNeededAndSufficient(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "setpriv")
	data, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CapabilityBoundingSet=(.*)$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("no CapabilityBoundingSet in the unit")
	}
	caps := strings.Fields(string(m[1]))
	for c := range needs {
		if !slices.Contains(caps, c) {
			t.Errorf("the unit no longer grants %s; update this test and the DaemonSet", c)
		}
	}
	for _, c := range caps {
		if _, ok := needs[c]; !ok {
			t.Errorf("the unit grants %s, which no step here needs: justify it with one", c)
		}
	}

	ns := testutil.NewNetns(t, "klcap")
	// A process of another user to look at, as a container's would be.
	target := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "sleep", "60")
	if err := target.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Process.Kill(); _ = target.Wait() })
	// setpriv execs sleep in place; wait until the pid shows the new uid.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if st, err := os.Stat("/proc/" + strconv.Itoa(target.Process.Pid)); err == nil && st.Sys().(*syscall.Stat_t).Uid == 65534 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("target process never ran as uid 65534")
		}
		time.Sleep(10 * time.Millisecond)
	}

	run := func(bounding []string) map[string]string {
		t.Helper()
		set := "-all"
		for _, c := range bounding {
			set += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
		}
		cmd := exec.Command("setpriv", "--bounding-set", set, "--inh-caps", "-all", "--",
			os.Args[0], "-test.run", "^TestCapsHelper$", "-test.v")
		cmd.Env = append(os.Environ(), "KL_CAPS_HELPER="+ns.Path+","+strconv.Itoa(target.Process.Pid))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helper with %v: %v\n%s", bounding, err, out)
		}
		i := strings.Index(string(out), "KLCAPS ")
		if i < 0 {
			t.Fatalf("helper printed no result:\n%s", out)
		}
		line := string(out[i+len("KLCAPS "):])
		line = line[:strings.IndexByte(line, '\n')]
		res := map[string]string{}
		if err := json.Unmarshal([]byte(line), &res); err != nil {
			t.Fatalf("helper result %q: %v", line, err)
		}
		return res
	}

	all := run(caps)
	for _, s := range capsSteps {
		if all[s] != "" {
			t.Errorf("with the unit's capabilities, %s failed: %s", s, all[s])
		}
	}
	for _, c := range caps {
		without := slices.DeleteFunc(slices.Clone(caps), func(x string) bool { return x == c })
		res := run(without)
		for _, s := range needs[c] {
			if res[s] == "" {
				t.Errorf("without %s, %s still works: the capability is not needed for it", c, s)
			} else {
				t.Logf("without %s: %s fails (%s)", c, s, res[s])
			}
		}
	}
}

// TestCapsHelper is the helper process of TestCapabilitiesNeededAndSufficient; it does
// nothing in a normal run. It prints one JSON object: step → error ("" = ok).
func TestCapsHelper(t *testing.T) {
	env := os.Getenv("KL_CAPS_HELPER")
	if env == "" {
		return // not a helper run; nothing to test here
	}
	nsPath, pid, _ := strings.Cut(env, ",")
	res := map[string]string{}
	errStr := func(err error) string {
		if err == nil {
			return ""
		}
		return err.Error()
	}

	// Enter the pod netns on a locked thread that is never unlocked: the runtime
	// discards it when this goroutine ends.
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			res["setns"] = "open: " + err.Error()
			return
		}
		defer unix.Close(fd)
		res["setns"] = errStr(unix.Setns(fd, unix.CLONE_NEWNET))
		if res["setns"] != "" {
			res["listen-in-netns"] = "not in the netns"
		} else {
			ln, err := net.Listen("tcp", "127.0.0.1:15001")
			if err == nil {
				ln.Close()
			}
			res["listen-in-netns"] = errStr(err)
		}
		sfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err == nil {
			err = unix.SetsockoptInt(sfd, unix.SOL_SOCKET, unix.SO_MARK, 0x4b4c)
			unix.Close(sfd)
		}
		res["so_mark"] = errStr(err)
	}()
	<-done

	func() {
		fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			res["nftables"] = err.Error()
			return
		}
		defer unix.Close(fd)
		c, err := nftables.New(nftables.WithNetNSFd(fd))
		if err != nil {
			res["nftables"] = err.Error()
			return
		}
		tb := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "klcaps"})
		if err := c.Flush(); err != nil {
			res["nftables"] = err.Error()
			return
		}
		c.DelTable(tb)
		res["nftables"] = errStr(c.Flush())
	}()

	f, err := os.Open("/proc/" + pid + "/ns/net")
	if err == nil {
		f.Close()
	}
	res["proc-ns-open"] = errStr(err)
	_, err = os.Readlink("/proc/" + pid + "/exe")
	res["proc-exe"] = errStr(err)
	_, err = os.ReadDir("/proc/" + pid + "/fd")
	res["proc-fd"] = errStr(err)

	b, _ := json.Marshal(res)
	fmt.Printf("KLCAPS %s\n", b)
}
