package model

import "testing"

func TestStageSpecHolds(t *testing.T) {
	for _, c := range []struct {
		s    StageSpec
		want string
	}{
		{StageSpec{FirstLayer: 0, LastLayer: 1, Embedding: true}, "embedding, head, layer 0"},
		{StageSpec{FirstLayer: 1, LastLayer: 2}, "layer 1"},
		{StageSpec{FirstLayer: 2, LastLayer: 4}, "layers 2-3"},
		{StageSpec{Embedding: true}, "embedding, head"},
	} {
		if got := c.s.Holds(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.s, got, c.want)
		}
	}
}
