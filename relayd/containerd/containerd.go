// Package containerd reads one container's labels and image from containerd's containers
// service by container id, for the daemon's registration enrichment.
//
// It speaks the containers service of github.com/containerd/containerd/api over gRPC on
// containerd's socket, rather than through github.com/containerd/containerd/v2's client:
// one read-only Get call does not need the full client's dependency tree. The service and
// its wire form are the same from containerd 1.6 to 2.x. A container lives in one
// containerd namespace (k8s.io for the CRI plugin, default for ctr, moby for Docker); the
// lookup asks each configured namespace in turn.
package containerd

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	containers "github.com/containerd/containerd/api/services/containers/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// DefaultSocket is containerd's socket on a node, and DefaultNamespaces are the
// namespaces asked when none are configured: the CRI plugin's (Kubernetes pods) and
// ctr's.
const DefaultSocket = "/run/containerd/containerd.sock"

var DefaultNamespaces = []string{"k8s.io", "default"}

// namespaceHeader is the gRPC metadata key containerd reads the namespace of a call from.
const namespaceHeader = "containerd-namespace"

// CRI labels: the kind of a CRI container (a pod sandbox or an application container).
const (
	criKindLabel   = "io.cri-containerd.kind"
	criKindSandbox = "sandbox"
)

// Container is what kl needs to know about a containerd container.
type Container struct {
	ID        string
	Namespace string            // the containerd namespace it was found in
	Image     string            // the reference it was created from, as containerd keeps it
	Labels    map[string]string // containerd's container labels (for CRI: the pod's labels)
	// Sandbox marks a CRI pod sandbox: its image is the pause image, not the workload's,
	// so callers should not match image rules on it.
	Sandbox bool
}

// ErrUnavailable marks a containerd socket that is absent or does not answer; callers
// decide whether that matters (a Docker-only node has no containerd to ask).
var ErrUnavailable = errors.New("containerd unavailable")

// Client reads from one containerd socket. A zero Namespaces means DefaultNamespaces.
type Client struct {
	Socket     string
	Namespaces []string
	Timeout    time.Duration // bounds the whole lookup (default 5s)
}

// Lookup returns the container with exactly this id from the first namespace that has
// it; found is false when no namespace does (the container belongs to another engine).
func (c Client) Lookup(ctx context.Context, id string) (ct Container, found bool, err error) {
	if id == "" {
		return ct, false, errors.New("containerd lookup: empty container id")
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+c.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return ct, false, fmt.Errorf("containerd lookup %s: %w", id, err)
	}
	defer conn.Close()
	return lookup(ctx, containers.NewContainersClient(conn), c.Socket, c.namespaces(), id)
}

func (c Client) namespaces() []string {
	if len(c.Namespaces) == 0 {
		return DefaultNamespaces
	}
	return c.Namespaces
}

// lookup asks each namespace in turn; a NotFound answer moves on to the next.
func lookup(ctx context.Context, svc containers.ContainersClient, socket string, namespaces []string, id string) (Container, bool, error) {
	for _, ns := range namespaces {
		resp, err := svc.Get(metadata.AppendToOutgoingContext(ctx, namespaceHeader, ns),
			&containers.GetContainerRequest{ID: id})
		switch status.Code(err) {
		case codes.OK:
			if resp.GetContainer() == nil {
				return Container{}, false, fmt.Errorf("containerd lookup %s in namespace %s: empty answer", id, ns)
			}
			return FromAPI(ns, resp.GetContainer()), true, nil
		case codes.NotFound:
			continue
		case codes.Unavailable, codes.DeadlineExceeded:
			return Container{}, false, fmt.Errorf("%w at %s: %w", ErrUnavailable, socket, err)
		default:
			return Container{}, false, fmt.Errorf("containerd lookup %s in namespace %s: %w", id, ns, err)
		}
	}
	return Container{}, false, nil
}

// FromAPI maps containerd's container record to what kl keeps of it.
func FromAPI(namespace string, c *containers.Container) Container {
	ct := Container{ID: c.GetID(), Namespace: namespace, Image: c.GetImage(), Labels: c.GetLabels()}
	ct.Sandbox = ct.Labels[criKindLabel] == criKindSandbox
	return ct
}

// namespaceRe is containerd's own rule for namespace names (namespaces.Validate).
var namespaceRe = regexp.MustCompile(`^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$`)

// CheckNamespace reports whether name is a namespace containerd would accept.
func CheckNamespace(name string) error {
	if len(name) > 76 || !namespaceRe.MatchString(name) {
		return fmt.Errorf("containerd namespace %q: only letters and digits, joined by single '.', '_' or '-', at most 76 characters", name)
	}
	return nil
}
