package sim

import (
	"bytes"
	"errors"
	"math"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestBuiltinNetwork(t *testing.T) {
	net, err := Builtin("volunteers20")
	if err != nil {
		t.Fatal(err)
	}
	regions := map[string]bool{}
	for i := range net.N() {
		regions[net.Node(i).Region] = true
	}
	// The issue asks for a realistic spread: 12-20 nodes in 4-10 regions.
	if net.N() < 12 || net.N() > 20 || len(regions) < 4 || len(regions) > 10 {
		t.Errorf("%v: %d nodes in %d regions", net, net.N(), len(regions))
	}
	// usw-cable-1 -> euw-dc-1: 12 ms access + 70 ms us-west/eu-west + 0.5 ms
	// access; 0.88 * min(20 up, 10000 down) Mbit/s = 2.2e6 bytes/s.
	i, _ := net.Index("usw-cable-1")
	j, _ := net.Index("euw-dc-1")
	l := net.Link(i, j)
	if math.Abs(l.Latency-0.0825) > 1e-12 || math.Abs(l.Rate-2.2e6) > 1e-6 {
		t.Errorf("link %+v, want latency 0.0825 s and rate 2.2e6 B/s", l)
	}
	if back := net.Link(j, i); math.Abs(back.Rate-0.88*300e6/8) > 1e-6 {
		t.Errorf("reverse rate %v, want the 300 Mbit/s downlink's", back.Rate)
	}
	if self := net.Link(i, i); self.Seconds(1e9) != 0 {
		t.Errorf("a node's link to itself costs %v s", self.Seconds(1e9))
	}
	// The file on disk is the embedded one.
	data, err := os.ReadFile("networks/volunteers20.json")
	if err != nil {
		t.Fatal(err)
	}
	disk, err := ParseNetwork(data)
	if err != nil || !reflect.DeepEqual(disk.Spec(), net.Spec()) {
		t.Errorf("networks/volunteers20.json: %v", err)
	}
}

func TestSpecRoundTrip(t *testing.T) {
	net, err := RandomNetwork(7, 40)
	if err != nil {
		t.Fatal(err)
	}
	data, err := MarshalSpec(net.Spec())
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseNetwork(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Spec(), net.Spec()) {
		t.Error("spec changed through MarshalSpec and ParseNetwork")
	}
}

func TestParseNetworkRejects(t *testing.T) {
	good := `{"name":"n","regions":["a","b"],"latency_ms":[[1,2],[2,1]],` +
		`"nodes":[{"id":"x","region":"a","speed":1,"memory_gib":1,"up_mbps":1,"down_mbps":1,"access_ms":0}]}`
	if _, err := ParseNetwork([]byte(good)); err != nil {
		t.Fatalf("the valid base case: %v", err)
	}
	tests := []struct {
		name, from, to string
		want           error
	}{
		{"unknown field", `"name":"n"`, `"name":"n","nodez":1`, ErrNetwork},
		{"trailing data", `]}`, `]} {}`, ErrNetwork},
		{"short latency row", `[2,1]]`, `[2]]`, ErrNetwork},
		{"missing latency row", `[[1,2],[2,1]]`, `[[1,2]]`, ErrNetwork},
		{"negative latency", `[[1,2]`, `[[-1,2]`, ErrNetwork},
		{"latency over 10 s", `[[1,2]`, `[[10001,2]`, ErrNetwork},
		{"unknown region", `"region":"a"`, `"region":"c"`, ErrNetwork},
		{"duplicate region", `["a","b"]`, `["a","a"]`, ErrNetwork},
		{"zero speed", `"speed":1`, `"speed":0`, ErrNetwork},
		{"zero uplink", `"up_mbps":1`, `"up_mbps":0`, ErrNetwork},
		{"huge downlink", `"down_mbps":1`, `"down_mbps":1e300`, ErrNetwork},
		{"empty id", `"id":"x"`, `"id":""`, ErrNetwork},
		{"id with a space", `"id":"x"`, `"id":"x y"`, ErrNetwork},
		{"goodput over 1", `"name":"n"`, `"name":"n","goodput":1.5`, ErrNetwork},
		{"no nodes", `"nodes":[{"id":"x","region":"a","speed":1,"memory_gib":1,"up_mbps":1,"down_mbps":1,"access_ms":0}]`, `"nodes":[]`, ErrNetwork},
		{"no regions", `"regions":["a","b"],"latency_ms":[[1,2],[2,1]]`, `"regions":[],"latency_ms":[]`, ErrNetwork},
		{"not JSON", good, `{`, ErrNetwork},
	}
	for _, tt := range tests {
		in := strings.Replace(good, tt.from, tt.to, 1)
		if in == good {
			t.Fatalf("%s: the replacement did not apply", tt.name)
		}
		if _, err := ParseNetwork([]byte(in)); !errors.Is(err, tt.want) {
			t.Errorf("%s: error %v, want %v", tt.name, err, tt.want)
		}
	}
	dup := strings.Replace(good, `}]}`, `},{"id":"x","region":"b","speed":1,"memory_gib":1,"up_mbps":1,"down_mbps":1,"access_ms":0}]}`, 1)
	if _, err := ParseNetwork([]byte(dup)); !errors.Is(err, ErrNetwork) {
		t.Errorf("duplicate node ID: %v", err)
	}
	big := append([]byte(good), bytes.Repeat([]byte(" "), MaxSpecBytes)...)
	if _, err := ParseNetwork(big); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized file: %v", err)
	}
}

func TestRandomNetworkDeterministic(t *testing.T) {
	a, err := RandomNetwork(3, 20)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := RandomNetwork(3, 20)
	c, _ := RandomNetwork(4, 20)
	if !reflect.DeepEqual(a.Spec(), b.Spec()) || reflect.DeepEqual(a.Spec(), c.Spec()) {
		t.Error("RandomNetwork is not a function of its seed")
	}
	if _, err := RandomNetwork(1, MaxNodes+1); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too many nodes: %v", err)
	}
}

func TestKeep(t *testing.T) {
	net, err := Builtin("volunteers20")
	if err != nil {
		t.Fatal(err)
	}
	eu, err := net.Keep(func(n Node) bool { return strings.HasPrefix(n.Region, "eu-") })
	if err != nil {
		t.Fatal(err)
	}
	// 3 eu-west and 4 eu-central nodes, in their original order.
	if eu.N() != 7 || eu.Node(0).ID != "euw-dc-1" || eu.Node(6).ID != "euc-cable-2" {
		t.Errorf("kept %v: first %s, last %s", eu, eu.Node(0).ID, eu.Node(eu.N()-1).ID)
	}
	if _, err := net.Keep(func(Node) bool { return false }); !errors.Is(err, ErrNetwork) {
		t.Errorf("keeping nobody: %v", err)
	}
}

func TestSpecTooManyNodes(t *testing.T) {
	s := Spec{Name: "big", Regions: []string{"r"}, LatencyMs: [][]float64{{1}}}
	for i := range MaxNodes + 1 {
		s.Nodes = append(s.Nodes, NodeSpec{ID: "n" + strconv.Itoa(i), Region: "r", Speed: 1, MemoryGiB: 1, UpMbps: 1, DownMbps: 1})
	}
	if _, err := NewNetwork(s); !errors.Is(err, ErrTooLarge) {
		t.Errorf("%d nodes: %v", len(s.Nodes), err)
	}
	s.Nodes = s.Nodes[:MaxNodes]
	if _, err := NewNetwork(s); err != nil {
		t.Errorf("%d nodes: %v", len(s.Nodes), err)
	}
}
