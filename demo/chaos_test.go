package demo

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// The NoLoCo soak's loss invariant (honestLossesAgree) reads the honest
// volunteers' round lines: it holds when every loss is finite and each
// round's validation losses lie within nolocoSpread, and fails on a loss
// that is not finite, on a spread past the bound, and on logs with no
// round to compare.
func TestHonestLossesAgree(t *testing.T) {
	line := func(round int, loss, val string) string {
		if val == "" {
			return fmt.Sprintf("round %d: loss %s, 1.2k tok/s, 2 in group, 10.0 kB sent, 1.0s\n", round, loss)
		}
		return fmt.Sprintf("round %d: loss %s, val %s, 1.2k tok/s, 2 in group, 10.0 kB sent, 1.0s\n", round, loss, val)
	}
	for _, tt := range []struct {
		name string
		logs []string
		ok   bool
	}{
		{"agree", []string{line(1, "5.1", "5.20") + line(2, "4.9", "4.80"), line(1, "5.0", "5.30") + line(2, "4.8", "4.70")}, true},
		{"one round measured by one member", []string{line(1, "5.1", "5.20"), line(1, "5.0", "5.30") + line(2, "4.8", "4.70")}, true},
		{"spread too wide", []string{line(1, "5.1", "5.20") + line(2, "4.9", "4.10"), line(1, "5.0", "5.30") + line(2, "4.8", "4.70")}, false},
		{"train loss NaN", []string{line(1, "NaN", ""), line(1, "5.0", "5.30")}, false},
		{"no step since the round before", []string{line(1, "-", "5.20"), line(1, "5.0", "5.30")}, true},
		{"val loss +Inf", []string{line(1, "5.1", "+Inf"), line(1, "5.0", "5.30")}, false},
		{"nothing to compare", []string{line(1, "5.1", "5.20"), "joined the run\n"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			var logs []string
			for i, s := range tt.logs {
				p := filepath.Join(dir, fmt.Sprintf("volunteer-%d.log", i+1))
				if err := os.WriteFile(p, []byte("starting\n"+s+"round 9: adopted the run's state\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				logs = append(logs, p)
			}
			var got []Invariant
			honestLossesAgree(logs, func(name string, ok bool, format string, args ...any) {
				got = append(got, Invariant{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
			})
			if len(got) != 1 || got[0].OK != tt.ok {
				t.Fatalf("%+v, want one invariant, ok %v", got, tt.ok)
			}
			t.Log(got[0].Detail)
		})
	}
}

// loggedRounds reads the rounds an honest volunteer computed or adopted,
// and nothing else that starts with "round".
func TestLoggedRounds(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.log"), filepath.Join(dir, "b.log")
	os.WriteFile(a, []byte("round 3: loss 4.1, val 4.2, 1.2k tok/s\nround 4 started; its result lands during the next inner phase\n"), 0o644)
	os.WriteFile(b, []byte("joined\nround 5: adopted the run's state (state 00ff)\n round 6: loss 1\n"), 0o644)
	got := loggedRounds([]string{a, b, filepath.Join(dir, "missing.log")})
	if len(got) != 2 || !got[3] || !got[5] {
		t.Fatalf("logged rounds %v, want 3 and 5", got)
	}
}
