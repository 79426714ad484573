package experiment

import (
	"testing"

	"github.com/skein-ml/skein/optimizer"
)

// Every arm has a unique name and a configuration its optimizer and codec
// accept (an arm is run only in a benchmark, so a bad one would otherwise
// fail there, minutes in).
func TestArmsConfigure(t *testing.T) {
	seen := map[string]bool{}
	for _, a := range Arms() {
		if seen[a.Name] || a.Description == "" {
			t.Errorf("arm %q: repeated or undescribed", a.Name)
		}
		seen[a.Name] = true
		c := SwarmConfig{InnerSteps: 50, DiLoCo: optimizer.DefaultDiLoCo(), NoLoCo: optimizer.DefaultNoLoCo(), Codec: int8Codec()}
		a.configure(&c)
		if err := c.Codec.Validate(); err != nil {
			t.Errorf("arm %q: codec: %v", a.Name, err)
		}
		if c.Algorithm == DiLoCo {
			dc := c.DiLoCo
			if s := dc.Support; s != nil && s.Nominate > 0 {
				dc.Nominator = &nominationHub{} // the swarm gives one
			}
			if err := dc.Validate(); err != nil {
				t.Errorf("arm %q: %v", a.Name, err)
			}
		}
	}
}
