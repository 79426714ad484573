package node

import (
	"context"
	"fmt"
)

// nolocoState is the NoLoCo side of a volunteer (not yet run over the
// network).
type nolocoState struct{}

// initNoLoCo refuses: NoLoCo volunteers are not implemented yet.
func (v *Volunteer) initNoLoCo() error {
	return fmt.Errorf("%w: run %q trains noloco, which volunteers do not run over the network yet", ErrUnsupported, v.run.RunID)
}

func (v *Volunteer) runNoLoCo(context.Context) error { return nil }

func (s *nolocoState) save(*Volunteer) bool { return false }

func (s *nolocoState) close() {}

func (s *nolocoState) round() uint64 { return 0 }
