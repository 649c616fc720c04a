package cni

import (
	"testing"

	"github.com/kl-egress/kl/relayd/api/wire"
)

// A pod an older kl-cni (no CNI_IFNAME sent) registered with the new kl-relayd, which
// records the attachment {kl-test, ""}; after kl-cni is upgraded, its CHECK of that
// same attachment (kl-test, eth0) must pass.
func TestCheckOlderKlCNIAttachment(t *testing.T) {
	p, fr, _, _ := newPlugin()
	stdin := conf("", true)
	if err := p.Add(args(stdin)); err != nil {
		t.Fatal(err)
	}
	fr.atts["abc123"] = []wire.Attachment{{Network: "kl-test"}} // what kl-relayd records for an older kl-cni's ADD
	if err := p.Check(args(stdin)); err != nil {
		t.Errorf("CHECK of a healthy pod registered by an older kl-cni = %v", err)
	}
}
