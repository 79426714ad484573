package manifest

import (
	"errors"
	"fmt"
)

// Local holds the run-wide settings a volunteer may also give on its own
// command line. A zero (or nil) field is unset and means "take the
// manifest's"; a set one must agree with the manifest, so that a volunteer
// started with --preset small never silently trains a tiny run, nor the
// reverse.
type Local struct {
	Preset     string  // model.preset
	Seed       *uint64 // model.seed; nil when not given (0 is a valid seed)
	Batch      int     // model.batch
	SeqLen     int     // the effective sequence length (Manifest.SeqLen)
	InnerSteps int     // optimizer.inner_steps
	Codec      string  // wire.codec
	Optimizer  string  // optimizer.kind
}

// mismatchError is one disagreement between a volunteer and its run.
type mismatchError struct {
	field      string
	local, run any
}

func (e *mismatchError) Error() string {
	return fmt.Sprintf("manifest: %s: this volunteer says %s, the run says %s", e.field, show(e.local), show(e.run))
}

func (e *mismatchError) Is(target error) bool { return target == ErrMismatch }

func show(v any) string {
	if s, ok := v.(string); ok {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprint(v)
}

// Check reports every set field of l that disagrees with m, one error per
// field joined with errors.Join (one per line), each matching ErrMismatch
// and reading like
//
//	manifest: model.preset: this volunteer says "small", the run says "tiny"
//
// SeqLen is compared with m.SeqLen(), so a volunteer that gives the
// preset's context agrees with a manifest that leaves seq_len at 0. Check
// assumes m is valid; it returns nil when l sets nothing.
func (m Manifest) Check(l Local) error {
	var errs []error
	differ := func(field string, set bool, local, run any) {
		if set && local != run {
			errs = append(errs, &mismatchError{field: field, local: local, run: run})
		}
	}
	differ("model.preset", l.Preset != "", l.Preset, m.Model.Preset)
	if l.Seed != nil {
		differ("model.seed", true, *l.Seed, m.Model.Seed)
	}
	differ("model.batch", l.Batch != 0, l.Batch, m.Model.Batch)
	differ("model.seq_len", l.SeqLen != 0, l.SeqLen, m.SeqLen())
	differ("optimizer.kind", l.Optimizer != "", l.Optimizer, m.Optimizer.Kind)
	differ("optimizer.inner_steps", l.InnerSteps != 0, l.InnerSteps, m.Optimizer.InnerSteps)
	differ("wire.codec", l.Codec != "", l.Codec, m.Wire.Codec)
	return errors.Join(errs...)
}
