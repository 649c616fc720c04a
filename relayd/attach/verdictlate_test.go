package attach

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/kl-egress/kl/rules"
)

// TestLateVerdictAborted: when the daemon gives up waiting for a flow's verdict (its
// dial deadline passes while the attach side is still dialling), it tells the attach
// side to drop the flow. Otherwise the attach side carries it once its dial succeeds,
// and a destination that talks first fills a stream nobody reads: the flow stays up,
// its destination connection held, until yamux gives up on the stream minutes later.
func TestLateVerdictAborted(t *testing.T) {
	f := newFixture(t, clientAll)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ended := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ended <- err
			return
		}
		defer c.Close()
		// A server that talks first and never stops: it sees its peer go only when a
		// write fails.
		buf := make([]byte, 32<<10)
		for i := 0; i < 100000; i++ {
			c.SetWriteDeadline(time.Now().Add(30 * time.Second))
			if _, err := c.Write(buf); err != nil {
				ended <- err
				return
			}
		}
		ended <- errors.New("the destination wrote 3 GiB into the flow")
	}()
	dst := ln.Addr().(*net.TCPAddr).AddrPort()
	release := make(chan struct{})
	f.attach(ClientOptions{Token: testToken, dialDest: func(ctx context.Context, network, addr string) (net.Conn, error) {
		<-release // the daemon's deadline passes while the attach side dials
		return (&net.Dialer{}).DialContext(context.Background(), network, addr)
	}}, payWorkload)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if c, err := f.srv.Dial(ctx, payWorkload, rules.Flow{Labels: payWorkload.Labels, Dst: dst, ID: 9}, nil); err == nil {
		c.Close()
		t.Fatal("Dial succeeded although the attach side had not answered by its deadline")
	}
	close(release)
	select {
	case err := <-ended:
		t.Logf("the destination's connection ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the flow the daemon gave up on is still carried 10 s later")
	}
}
