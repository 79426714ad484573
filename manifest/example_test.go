package manifest_test

import (
	"errors"
	"fmt"

	"github.com/skein-ml/skein/manifest"
)

func ExampleParse() {
	m, err := manifest.Parse([]byte(`
run_id = "my-run"   # everything else from manifest.Default()
[model]
preset = "small"
`))
	if err != nil {
		panic(err)
	}
	fmt.Println(m.RunID, m.Model.Preset, m.SeqLen(), m.Optimizer.Kind, m.Wire.Codec)

	_, err = manifest.Parse([]byte("[optimizer]\ninner_steps = 0\n"))
	fmt.Println(err)
	fmt.Println(errors.Is(err, manifest.ErrInvalid))
	// Output:
	// my-run small 256 diloco minmax8
	// manifest: optimizer.inner_steps = 0: must be positive
	// true
}

func ExampleManifest_Check() {
	m := manifest.Default()
	err := m.Check(manifest.Local{Preset: "small", Batch: 8})
	fmt.Println(err)
	fmt.Println(errors.Is(err, manifest.ErrMismatch))
	// Output:
	// manifest: model.preset: this volunteer says "small", the run says "tiny"
	// true
}
