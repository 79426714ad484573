package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"strconv"
	"unicode/utf8"
)

// Canonical returns the manifest's canonical encoding: the bytes volunteers
// fetch from members and the input of Hash. It is TOML written by this
// package, not by a library, so that the bytes depend on the format version
// only: every key in schema order, one "key = value" per line, tables in
// the order model, optimizer, wire, data, data.shards, admission, pipeline
// (only when it differs from Default's); created
// and admission.run_key only when set, admission.max_members and
// max_per_prefix only when they differ from Default's (so that manifests
// written before those keys existed keep their hash); floats in Go's shortest round-trip form with ".0" added to
// integral values; no comments. -0 is written as 0 and an empty shard list
// is left out, as Parse would return them.
//
// For a valid m, Parse(m.Canonical()) returns a manifest deeply equal to m
// (up to that normalization), and its Canonical bytes are the same.
func (m Manifest) Canonical() []byte {
	m.normalize()
	w := canonicalWriter{b: make([]byte, 0, 1024)}
	w.str("run_id", m.RunID)
	w.int("version", int64(m.Version))
	if m.Created != "" {
		w.str("created", m.Created)
	}

	w.table("[model]")
	w.str("preset", m.Model.Preset)
	w.uint("seed", m.Model.Seed)
	w.int("batch", int64(m.Model.Batch))
	w.int("seq_len", int64(m.Model.SeqLen))

	o := m.Optimizer
	w.table("[optimizer]")
	w.str("kind", o.Kind)
	w.int("inner_steps", int64(o.InnerSteps))
	w.float("inner_lr", o.InnerLR)
	w.int("warmup", int64(o.Warmup))
	w.int("total_steps", int64(o.TotalSteps))
	w.float("weight_decay", o.WeightDecay)
	w.float("grad_clip", o.GradClip)
	w.float("outer_lr", o.OuterLR)
	w.float("outer_momentum", o.OuterMomentum)
	w.bool("nesterov", o.Nesterov)
	w.bool("delayed", o.Delayed)
	w.int("group_size", int64(o.GroupSize))
	w.float("gamma", o.Gamma)

	w.table("[wire]")
	w.str("codec", m.Wire.Codec)
	// Written only when compacted, so that older manifests keep their hashes.
	if m.Wire.Compacted() {
		w.str("outer", m.Wire.Outer)
		w.int("support_k", int64(m.Wire.SupportK))
		w.float("residual_decay", m.Wire.ResidualDecay)
		if m.Wire.Rotate { // written only when set, for the same reason
			w.bool("rotate", true)
		}
		if m.Wire.Tiled { // the same
			w.bool("tiled", true)
		}
	}
	if m.Wire.BlockSize != 0 {
		w.int("block_size", int64(m.Wire.BlockSize))
	}

	w.table("[data]")
	w.str("source", m.Data.Source)
	w.float("val_fraction", m.Data.ValFraction)
	w.int("shard_bytes", m.Data.ShardBytes)
	// Written only when not byte, so that the manifests of runs from before
	// tokenizers keep their hashes.
	if m.Data.Tokenized() {
		w.str("tokenizer", m.Data.Tokenizer)
	}
	if m.Data.TokenizerHash != "" {
		w.str("tokenizer_hash", m.Data.TokenizerHash)
	}
	if m.Data.Epochs != 0 {
		w.int("epochs", m.Data.Epochs)
	}
	if m.Data.MaxTokens != 0 {
		w.int("max_tokens", m.Data.MaxTokens)
	}
	for _, s := range m.Data.Shards {
		w.table("[[data.shards]]")
		w.str("hash", s.Hash)
		w.int("bytes", s.Bytes)
		if m.Data.Source != SourceDataset {
			w.int("files", int64(s.Files))
			continue
		}
		w.int("tokens", s.Tokens)
		w.int("documents", s.Documents)
		if s.Split != "" {
			w.str("split", s.Split)
		}
	}

	w.table("[admission]")
	a, d := m.Admission, Default().Admission
	w.str("mode", a.Mode)
	if a.MaxMembers != d.MaxMembers {
		w.int("max_members", int64(a.MaxMembers))
	}
	if a.MaxPerPrefix != d.MaxPerPrefix {
		w.int("max_per_prefix", int64(a.MaxPerPrefix))
	}
	if a.RunKey != "" {
		w.str("run_key", a.RunKey)
	}

	// A run that is not staged has no [pipeline] table, so that manifests
	// written before it existed keep their hash.
	if p := m.Pipeline; p != Default().Pipeline {
		w.table("[pipeline]")
		w.int("stages", int64(p.Stages))
		w.float("skip_ratio", p.SkipRatio)
		w.int("microbatches", int64(p.Microbatches))
		w.bool("checkfree_plus", p.CheckFreePlus)
	}
	return w.b
}

// Hash returns the SHA-256 of the canonical encoding: the run's manifest is
// named by it, and two manifests with the same hash are the same run.
func (m Manifest) Hash() [32]byte { return sha256.Sum256(m.Canonical()) }

// HashString returns Hash in lowercase hex (64 digits).
func (m Manifest) HashString() string {
	h := m.Hash()
	return hex.EncodeToString(h[:])
}

// ShortHash returns the first 12 hex digits of HashString, for logs and the
// status page; compare manifests by Hash, not by this.
func (m Manifest) ShortHash() string { return m.HashString()[:12] }

// canonicalWriter appends TOML lines.
type canonicalWriter struct{ b []byte }

func (w *canonicalWriter) table(header string) {
	w.b = append(w.b, '\n')
	w.b = append(w.b, header...)
	w.b = append(w.b, '\n')
}

func (w *canonicalWriter) key(k string) {
	w.b = append(w.b, k...)
	w.b = append(w.b, " = "...)
}

func (w *canonicalWriter) int(k string, v int64) {
	w.key(k)
	w.b = strconv.AppendInt(w.b, v, 10)
	w.b = append(w.b, '\n')
}

// uint writes v as is; a value over MaxSeed is not a TOML integer (Validate
// refuses it).
func (w *canonicalWriter) uint(k string, v uint64) {
	w.key(k)
	w.b = strconv.AppendUint(w.b, v, 10)
	w.b = append(w.b, '\n')
}

func (w *canonicalWriter) bool(k string, v bool) {
	w.key(k)
	w.b = strconv.AppendBool(w.b, v)
	w.b = append(w.b, '\n')
}

// float writes v in Go's shortest form that reads back exactly, as a TOML
// float: "0.001", "1.0", "1e+21", "5e-324"; nan and inf (which Validate
// refuses everywhere) in TOML's spelling.
func (w *canonicalWriter) float(k string, v float64) {
	w.key(k)
	switch {
	case math.IsNaN(v):
		w.b = append(w.b, "nan"...)
	case math.IsInf(v, 1):
		w.b = append(w.b, "inf"...)
	case math.IsInf(v, -1):
		w.b = append(w.b, "-inf"...)
	default:
		start := len(w.b)
		w.b = strconv.AppendFloat(w.b, v, 'g', -1, 64)
		integral := true
		for _, c := range w.b[start:] {
			if c == '.' || c == 'e' {
				integral = false
				break
			}
		}
		if integral {
			w.b = append(w.b, ".0"...)
		}
	}
	w.b = append(w.b, '\n')
}

// str writes a TOML basic string: '"' and '\' escaped, control characters
// as \uXXXX, invalid UTF-8 as U+FFFD, everything else as is.
func (w *canonicalWriter) str(k, v string) {
	w.key(k)
	w.b = append(w.b, '"')
	for i := 0; i < len(v); {
		r, size := utf8.DecodeRuneInString(v[i:])
		switch {
		case r == '"' || r == '\\':
			w.b = append(w.b, '\\', byte(r))
		case r < 0x20 || r == 0x7f:
			w.b = append(w.b, `\u00`...)
			w.b = append(w.b, "0123456789ABCDEF"[r>>4], "0123456789ABCDEF"[r&0xf])
		default:
			// Includes utf8.RuneError for an invalid byte.
			w.b = utf8.AppendRune(w.b, r)
		}
		i += size
	}
	w.b = append(w.b, '"', '\n')
}
