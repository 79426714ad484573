package replica

import (
	"fmt"
	"testing"
)

// BenchmarkRoundCertificate is what certificates cost one member per round
// in a group of M: signing and encoding its vote, checking the M-1 votes
// it receives, forming the certificate. It reports the bytes the member
// sends (its vote to each of the M-1 others, framing of p2p not counted)
// and the certificate's size.
//
//	go test ./replica -run '^$' -bench RoundCertificate
func BenchmarkRoundCertificate(b *testing.B) {
	for _, m := range []int{4, 8, 16, 64} {
		b.Run(fmt.Sprintf("M=%d", m), func(b *testing.B) {
			k, ids := newKeys(m)
			var votes []*Certificate
			for i := range ids {
				v := k.cert("skein-demo", 7, 42, ids, ids[i:i+1])
				votes = append(votes, v)
			}
			var sent, certBytes int
			b.ResetTimer()
			for range b.N {
				book := NewBook("skein-demo", k, &Certificate{Run: "skein-demo", Round: 6, Hash: 1})
				v, err := book.Vote(7, 42, ids, ids[0], k.signAs(ids[0]))
				if err != nil {
					b.Fatal(err)
				}
				wire, _ := v.MarshalBinary()
				sent = len(wire) * (m - 1)
				for i := 1; i < m; i++ {
					if _, err := book.AddVote(votes[i], ids[i]); err != nil {
						b.Fatal(err)
					}
				}
				c := book.Trusted()
				if c.Round != 7 {
					b.Fatal("no certificate formed")
				}
				cb, _ := c.MarshalBinary()
				certBytes = len(cb)
			}
			b.ReportMetric(float64(sent), "B-sent/member")
			b.ReportMetric(float64(certBytes), "B/cert")
		})
	}
}

// BenchmarkAdoptChainPage is what one page of a chain (ChainPage
// certificates, the most one answer carries) costs a member to check: an
// honest page (groups of 16, every member signing) against a liar's page
// of well-signed certificates from 64 sybils of its own, which must be
// refused before any signature is checked (the chain's link is counted
// first).
//
//	go test ./replica -run '^$' -bench AdoptChainPage
func BenchmarkAdoptChainPage(b *testing.B) {
	k, ids := newKeys(16 + 64)
	honest, sybils := ids[:16], ids[16:]
	anchor := k.cert("skein-demo", 100, 1, honest, honest)
	var page, lies []*Certificate
	for i := range ChainPage {
		page = append(page, k.cert("skein-demo", uint64(101+i), uint64(i), honest, honest))
		lies = append(lies, k.cert("skein-demo", uint64(101+i), uint64(i), sybils, sybils))
	}
	for _, tc := range []struct {
		name  string
		chain []*Certificate
		ok    bool
	}{{"honest", page, true}, {"liar", lies, false}} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				_, err := NewBook("skein-demo", k, anchor).Adopt(tc.chain)
				if (err == nil) != tc.ok {
					b.Fatalf("adopt: %v", err)
				}
			}
		})
	}
}
