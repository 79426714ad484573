package bootstrap

import (
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

func TestReportLimits(t *testing.T) {
	var l reportLimits
	now := time.Unix(1000, 0)
	a, b := peer.ID("a"), peer.ID("b")
	for i := 0; i < reportBurst; i++ {
		if !l.allow(a, now) {
			t.Fatalf("report %d of the burst refused", i)
		}
	}
	if l.allow(a, now) {
		t.Fatal("report beyond the burst accepted")
	}
	if !l.allow(b, now) {
		t.Fatal("another peer limited by a's reports")
	}
	if l.allow(a, now.Add(reportInterval/2)) {
		t.Fatal("accepted before a token was earned")
	}
	if !l.allow(a, now.Add(reportInterval)) {
		t.Fatal("refused after a token was earned")
	}
	// The table stays bounded: 10x the cap of distinct peers.
	for i := 0; i < 10*maxLimited; i++ {
		l.allow(peer.ID(fmt.Sprint(i)), now.Add(time.Duration(i)))
	}
	if len(l.peers) > maxLimited {
		t.Fatalf("%d peers tracked, cap %d", len(l.peers), maxLimited)
	}
}
