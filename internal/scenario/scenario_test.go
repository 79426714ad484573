package scenario

import (
	"reflect"
	"testing"
)

func TestParse(t *testing.T) {
	got := Parse([]byte("# a comment\nnodes a b\n\n  start 1 7 a  # trailing\n#\nrun 3"))
	want := []Line{
		{2, "nodes a b", []string{"nodes", "a", "b"}},
		{4, "start 1 7 a", []string{"start", "1", "7", "a"}},
		{6, "run 3", []string{"run", "3"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}
