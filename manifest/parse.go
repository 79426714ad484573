package manifest

import (
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/skein-ml/skein/optimizer"
)

// Parse decodes and validates a manifest. It is strict: input over MaxSize
// bytes is refused before decoding, and so is any key the schema does not
// define (keys are case-sensitive). Keys left out take Default's values,
// except that under optimizer.kind = "noloco" a missing outer_lr or
// outer_momentum takes optimizer.DefaultNoLoCo's. Every error matches
// ErrInvalid; a TOML syntax or type error also unwraps to the decoder's
// toml.ParseError.
func Parse(b []byte) (Manifest, error) {
	m, err := parse(b)
	if err != nil {
		return Manifest{}, err
	}
	if err := m.Validate(); err != nil {
		return Manifest{}, err
	}
	return m, nil
}

// ParseTemplate is Parse with ValidateTemplate: a "shards" run may list no
// shards yet (the bootstrap packs them).
func ParseTemplate(b []byte) (Manifest, error) {
	m, err := parse(b)
	if err != nil {
		return Manifest{}, err
	}
	if err := m.ValidateTemplate(); err != nil {
		return Manifest{}, err
	}
	return m, nil
}

func parse(b []byte) (Manifest, error) {
	if len(b) > MaxSize {
		return Manifest{}, &invalidError{msg: fmt.Sprintf("%d bytes, more than the limit of %d", len(b), MaxSize)}
	}
	m := Default()
	md, err := toml.Decode(string(b), &m)
	if err != nil {
		return Manifest{}, &invalidError{msg: err.Error(), cause: err}
	}
	// The decoder matches keys case-insensitively, so Undecoded alone would
	// let "Model.Preset" through; every key must be spelled as the schema
	// spells it.
	for _, k := range md.Keys() {
		if err := checkKey(k.String()); err != nil {
			return Manifest{}, err
		}
	}
	if md.IsDefined("model", "seed") && m.Model.Seed > MaxSeed {
		// TOML integers are int64, so this was a negative number.
		return Manifest{}, bad("model.seed", int64(m.Model.Seed), "must be >= 0")
	}
	if u := md.Undecoded(); len(u) > 0 {
		return Manifest{}, &invalidError{msg: fmt.Sprintf("unknown key %q", u[0].String())}
	}
	if m.Optimizer.Kind == KindNoLoCo {
		n := optimizer.DefaultNoLoCo()
		if !md.IsDefined("optimizer", "outer_lr") {
			m.Optimizer.OuterLR = n.OuterLR
		}
		if !md.IsDefined("optimizer", "outer_momentum") {
			m.Optimizer.OuterMomentum = n.Momentum
		}
	}
	m.normalize()
	return m, nil
}

// Load reads and parses the manifest at path. A file over MaxSize bytes is
// refused without reading all of it.
func Load(path string) (Manifest, error) { return load(path, Parse) }

// LoadTemplate is Load with ParseTemplate (the bootstrap's --manifest).
func LoadTemplate(path string) (Manifest, error) { return load(path, ParseTemplate) }

func load(path string, parse func([]byte) (Manifest, error)) (Manifest, error) {
	f, err := os.Open(path)
	if err != nil {
		return Manifest{}, fmt.Errorf("manifest: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return Manifest{}, fmt.Errorf("manifest: %w", err)
	}
	m, err := parse(b)
	if err != nil {
		return Manifest{}, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// normalize puts m in the form Parse returns, so that equal manifests are
// deeply equal and encode to the same bytes: -0 becomes 0 and an empty
// shard list becomes nil.
func (m *Manifest) normalize() {
	o := &m.Optimizer
	for _, p := range []*float64{&o.InnerLR, &o.WeightDecay, &o.GradClip, &o.OuterLR, &o.OuterMomentum, &o.Gamma, &m.Data.ValFraction} {
		if *p == 0 {
			*p = 0
		}
	}
	if len(m.Data.Shards) == 0 {
		m.Data.Shards = nil
	}
	if m.Data.Tokenizer == TokenizerByte {
		m.Data.Tokenizer = "" // the default, spelt out or not
	}
}

// knownKeys holds every key of the schema, tables included, in
// toml.Key.String form ("model", "model.preset", "data.shards.hash"),
// read from Manifest's toml tags.
var knownKeys = func() map[string]bool {
	keys := make(map[string]bool)
	var walk func(prefix string, t reflect.Type)
	walk = func(prefix string, t reflect.Type) {
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			key := prefix + name
			keys[key] = true
			switch ft := f.Type; {
			case ft.Kind() == reflect.Struct:
				walk(key+".", ft)
			case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
				walk(key+".", ft.Elem())
			}
		}
	}
	walk("", reflect.TypeFor[Manifest]())
	return keys
}()

// checkKey refuses a key the schema does not define, suggesting the right
// spelling when only the case differs.
func checkKey(k string) error {
	if knownKeys[k] {
		return nil
	}
	for known := range knownKeys {
		if strings.EqualFold(known, k) {
			return &invalidError{msg: fmt.Sprintf("unknown key %q (keys are case-sensitive; did you mean %q?)", k, known)}
		}
	}
	return &invalidError{msg: fmt.Sprintf("unknown key %q", k)}
}
