package runtime

import (
	"errors"
	"strings"
	"testing"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name string
		args string
		want Invocation
	}{
		{"containerd create", "--root /run/containerd/runc/default --log /b/log.json --log-format json create --bundle /b --pid-file /b/init.pid c1",
			Invocation{Command: "create", ContainerID: "c1", Bundle: "/b", Log: "/b/log.json", LogFormat: "json", Root: "/run/containerd/runc/default"}},
		{"equals", "--root=/r create --bundle=/b c1", Invocation{Command: "create", ContainerID: "c1", Bundle: "/b", Root: "/r"}},
		{"short b", "create -b /b c1", Invocation{Command: "create", ContainerID: "c1", Bundle: "/b"}},
		{"short b equals", "create -b=/b c1", Invocation{Command: "create", ContainerID: "c1", Bundle: "/b"}},
		{"single dash long", "-root /r create -bundle /b c1", Invocation{Command: "create", ContainerID: "c1", Bundle: "/b", Root: "/r"}},
		{"flags after id", "create c1 --bundle /b --console-socket /s", Invocation{Command: "create", ContainerID: "c1", Bundle: "/b"}},
		{"default bundle", "run -d c1", Invocation{Command: "run", ContainerID: "c1"}},
		{"bool globals", "--debug --systemd-cgroup run --detach --bundle /b c1", Invocation{Command: "run", ContainerID: "c1", Bundle: "/b"}},
		{"value looks like command", "--log create run --bundle create c1", Invocation{Command: "run", ContainerID: "c1", Bundle: "create", Log: "create"}},
		{"value is a flag", "create --console-socket -b --bundle /b c1", Invocation{Command: "create", ContainerID: "c1", Bundle: "/b"}},
		{"pid file value not id", "create --pid-file p --bundle /b c1", Invocation{Command: "create", ContainerID: "c1", Bundle: "/b"}},
		{"crun config", "create --config other.json -b /b c1", Invocation{Command: "create", ContainerID: "c1", Bundle: "/b", ConfigFile: "other.json"}},
		{"double dash", "create --bundle /b -- -weird", Invocation{Command: "create", ContainerID: "-weird", Bundle: "/b"}},
		{"state", "--root /r state c1", Invocation{Command: "state", Root: "/r"}},
		{"delete force", "delete --force c1", Invocation{Command: "delete"}},
		{"kill", "kill c1 KILL", Invocation{Command: "kill"}},
		{"pidfd socket (runc 1.2)", "--root /run/runc create --pidfd-socket /run/x/pidfd.sock --bundle /b ctr1", Invocation{Command: "create", ContainerID: "ctr1", Bundle: "/b", Root: "/run/runc"}},
		{"pidfd socket after id", "run ctr1 --pidfd-socket /s -b /b", Invocation{Command: "run", ContainerID: "ctr1", Bundle: "/b"}},
		{"exec process file", "--root /r exec --process /p c1", Invocation{Command: "exec", ContainerID: "c1", ProcessFile: "/p", Root: "/r"}},
		{"exec containerd", "--root /run/containerd/runc/k8s.io --log /b/log.json --log-format json exec --process /tmp/runc-process1 --console-socket /s --detach --pid-file /b/e.pid c1",
			Invocation{Command: "exec", ContainerID: "c1", ProcessFile: "/tmp/runc-process1", Log: "/b/log.json", LogFormat: "json", Root: "/run/containerd/runc/k8s.io"}},
		{"exec short p equals", "exec -t -p=/p --pidfd-socket /s c1", Invocation{Command: "exec", ContainerID: "c1", ProcessFile: "/p"}},
		{"exec without process file", "exec -e A=1 -u 0:0 --cwd /x --cap CAP_KILL c1 sh -c --process", Invocation{Command: "exec", ContainerID: "c1"}},
		{"exec command flags not read", "exec c1 sh --process /p", Invocation{Command: "exec", ContainerID: "c1"}},
		{"exec dangling", "exec --process", Invocation{Command: "exec"}},
		{"exec double dash", "exec -p /p -- c1 sh", Invocation{Command: "exec", ContainerID: "c1", ProcessFile: "/p"}},
		{"version", "--version", Invocation{}},
		{"nothing", "", Invocation{}},
		{"dangling global", "--root", Invocation{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseArgs(strings.Fields(tt.args))
			if err != nil || got != tt.want {
				t.Errorf("ParseArgs(%q) = %+v, %v, want %+v", tt.args, got, err, tt.want)
			}
		})
	}
}

func TestParseArgsBad(t *testing.T) {
	for _, args := range []string{"create", "create --bundle", "run -b /b", "create c1 --pid-file", "create -b=/b --"} {
		if got, err := ParseArgs(strings.Fields(args)); !errors.Is(err, ErrUsage) {
			t.Errorf("ParseArgs(%q) = %+v, %v, want ErrUsage", args, got, err)
		}
	}
}

// FuzzParseArgs feeds NUL-separated command lines: the parser must never panic, must
// report create/run only with a container id, and must only ever return a bundle that
// is one of the arguments.
func FuzzParseArgs(f *testing.F) {
	for _, s := range []string{
		"--root\x00/r\x00create\x00--bundle\x00/b\x00c1",
		"create\x00-b=/b\x00c1",
		"run\x00-d\x00c1\x00--bundle\x00/x",
		"--log\x00create\x00run\x00--bundle\x00create\x00c1",
		"-\x00--\x00---\x00-=\x00create",
		"delete\x00--force\x00c1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		args := strings.Split(s, "\x00")
		inv, err := ParseArgs(args)
		if err != nil {
			if !errors.Is(err, ErrUsage) {
				t.Fatalf("ParseArgs(%q): error not ErrUsage: %v", args, err)
			}
			return
		}
		if (inv.Command == "create" || inv.Command == "run") && inv.ContainerID == "" {
			t.Fatalf("ParseArgs(%q) = %+v: create without an id", args, inv)
		}
		if inv.Bundle != "" {
			found := false
			for _, a := range args {
				if a == inv.Bundle || strings.HasSuffix(a, "="+inv.Bundle) {
					found = true
				}
			}
			if !found {
				t.Fatalf("ParseArgs(%q) bundle %q is not from the arguments", args, inv.Bundle)
			}
		}
	})
}
