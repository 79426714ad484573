package manifest

import (
	"errors"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	m := Default() // tiny (context 128), seed 1, batch 8, seq_len 0, diloco, H 50, minmax8
	cases := []struct {
		l    Local
		want []string // the lines of the error, in order; none when l agrees
	}{
		{Local{}, nil},
		{Local{Preset: "tiny", Seed: new(uint64(1)), Batch: 8, SeqLen: 128, InnerSteps: 50, Codec: "minmax8", Optimizer: "diloco"}, nil},
		{Local{Preset: "small"}, []string{`manifest: model.preset: this volunteer says "small", the run says "tiny"`}},
		{Local{Seed: new(uint64(0))}, []string{`manifest: model.seed: this volunteer says 0, the run says 1`}},
		{Local{Batch: 16}, []string{`manifest: model.batch: this volunteer says 16, the run says 8`}},
		{Local{SeqLen: 64}, []string{`manifest: model.seq_len: this volunteer says 64, the run says 128`}},
		{Local{InnerSteps: 100}, []string{`manifest: optimizer.inner_steps: this volunteer says 100, the run says 50`}},
		{Local{Codec: "int8"}, []string{`manifest: wire.codec: this volunteer says "int8", the run says "minmax8"`}},
		{Local{Optimizer: "noloco"}, []string{`manifest: optimizer.kind: this volunteer says "noloco", the run says "diloco"`}},
		{Local{Preset: "small", Batch: 8, Codec: "fp32"}, []string{
			`manifest: model.preset: this volunteer says "small", the run says "tiny"`,
			`manifest: wire.codec: this volunteer says "fp32", the run says "minmax8"`,
		}},
	}
	for i, c := range cases {
		err := m.Check(c.l)
		if c.want == nil {
			if err != nil {
				t.Errorf("case %d: %v, want agreement", i, err)
			}
			continue
		}
		if !errors.Is(err, ErrMismatch) || errors.Is(err, ErrInvalid) {
			t.Errorf("case %d: %v, want ErrMismatch", i, err)
			continue
		}
		if got := strings.Split(err.Error(), "\n"); strings.Join(got, "\n") != strings.Join(c.want, "\n") {
			t.Errorf("case %d:\ngot  %q\nwant %q", i, got, c.want)
		}
	}
}

func TestCheckExplicitSeqLen(t *testing.T) {
	m := Default()
	m.Model.SeqLen = 64
	if err := m.Check(Local{SeqLen: 64}); err != nil {
		t.Error(err)
	}
	if err := m.Check(Local{SeqLen: 128}); !errors.Is(err, ErrMismatch) {
		t.Errorf("128 against 64: %v", err)
	}
}
