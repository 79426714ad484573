package sim

import (
	"math"
	"reflect"
	"testing"
)

// FuzzParseNetwork: decoding any bytes never panics, and whatever it accepts
// is a network whose every link is usable and which survives a round trip.
// The seeds are the shipped network and small edits of a minimal one.
func FuzzParseNetwork(f *testing.F) {
	for _, name := range BuiltinNames() {
		data, err := builtin.ReadFile("networks/" + name + ".json")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"name":"n","regions":["a"],"latency_ms":[[1]],"nodes":[{"id":"x","region":"a","speed":1,"memory_gib":1,"up_mbps":1,"down_mbps":1,"access_ms":0}]}`))
	f.Add([]byte(`{"regions":["a","b"],"latency_ms":[[1,2],[2]],"nodes":[]}`))
	f.Add([]byte(`{"goodput":1e-300,"regions":["a"],"latency_ms":[[0]],"nodes":[{"id":"x","region":"a","speed":1e-300,"memory_gib":1,"up_mbps":1e-300,"down_mbps":1,"access_ms":0}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		net, err := ParseNetwork(data)
		if err != nil {
			return
		}
		if net.N() < 1 || net.N() > MaxNodes {
			t.Fatalf("accepted %d nodes", net.N())
		}
		for i := range min(net.N(), 16) {
			for j := range min(net.N(), 16) {
				l := net.Link(i, j)
				if math.IsNaN(l.Latency) || l.Latency < 0 || math.IsInf(l.Latency, 0) || !(l.Rate > 0) {
					t.Fatalf("link %d->%d: %+v", i, j, l)
				}
			}
		}
		out, err := MarshalSpec(net.Spec())
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseNetwork(out)
		if err != nil || !reflect.DeepEqual(back.Spec(), net.Spec()) {
			t.Fatalf("round trip: %v", err)
		}
	})
}
