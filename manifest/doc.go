// Package manifest owns a run's manifest: the TOML document in which the
// run's operator fixes every run-wide setting (model preset and seed, batch
// and sequence length, inner and outer optimizer, wire codec, corpus shards,
// admission), its schema and validation, its canonical bytes and their
// SHA-256, and the check that a volunteer's own flags agree with it.
//
// The operator gives the file to `skein bootstrap --manifest run.toml`;
// volunteers fetch the canonical bytes from any member, verify them against
// the hash that members announce, and take their settings from them. A
// volunteer's command line may repeat a setting (Local), but never override
// it: Check names every disagreement.
//
// manifest must not touch the network or the file system (Load reads one
// file; nothing else does I/O), start goroutines, or import p2p, node or
// bootstrap: it is pure functions on bytes and values, importable by every
// command and tested without a run.
//
// # Use
//
//	m, err := manifest.Load("run.toml")       // or Parse(bytes fetched from a member)
//	if err != nil {                            // errors.Is(err, manifest.ErrInvalid)
//		return err                             // e.g. manifest: optimizer.inner_steps = 0: must be positive
//	}
//	if err := m.Check(manifest.Local{Preset: "small"}); err != nil {
//		return err                             // errors.Is(err, manifest.ErrMismatch)
//	}
//	b, h := m.Canonical(), m.Hash()            // what members serve, and its name
//
// # Parsing
//
// Parse refuses input over MaxSize bytes before decoding it, and refuses any
// key the schema does not define, naming it (keys are case-sensitive). Keys
// left out take Default's values (the demo's), except that under
// optimizer.kind = "noloco" a missing outer_lr or outer_momentum takes the
// NoLoCo paper's. Validate then reports the first bad value as
//
//	manifest: <section>.<key> = <value>: <what is wrong>
//
// # Canonical bytes and hash
//
// Canonical writes a manifest as TOML in one fixed form (see its doc), by
// this package's own writer, so that the bytes, and so Hash, depend on the
// manifest format version only, never on a TOML library's release. Two
// manifests describe the same run exactly when their hashes are equal:
// comments, key order, spacing and number spelling of the operator's file
// do not count, every value does (including the settings of the outer
// optimizer not selected by optimizer.kind). For every valid manifest m,
// Parse(m.Canonical()) returns m. Changing the canonical form changes every
// run's hash and needs a new Version.
//
// # Example
//
// A complete manifest (testdata/run.toml) with every key:
//
//	# run.toml: the manifest of one training run. The operator gives it to
//	# `skein bootstrap --manifest run.toml`; volunteers fetch it from any member
//	# and take every run-wide setting from it. Keys left out take the demo's
//	# defaults (manifest.Default); unknown keys are an error.
//	run_id = "skein-small-01"        # names the run in protocol IDs: 1..64 of [A-Za-z0-9._-]
//	version = 1                      # manifest format version; must be 1
//	created = "2025-06-01T12:00:00Z" # optional, RFC 3339, informational
//
//	[model]
//	preset = "small" # "tiny", "small", "gpt2", "gpt2-medium", "gpt2-large" or "gpt2-xl"
//	seed = 42        # initial weights and data order
//	batch = 16       # sequences per inner step on each volunteer, 1..4096
//	seq_len = 0      # tokens per sequence; 0 = the preset's context (256 for small)
//
//	[optimizer]
//	kind = "diloco"      # "diloco" or "noloco"
//	inner_steps = 100    # H: inner AdamW steps per outer round
//	inner_lr = 4e-4      # AdamW peak learning rate
//	warmup = 100         # linear warmup, in inner steps (at most total_steps)
//	total_steps = 20000  # length of the inner schedule: the cosine decay ends here
//	weight_decay = 0.1   # AdamW decoupled weight decay
//	grad_clip = 1.0      # max global gradient norm; 0 disables clipping
//	outer_lr = 0.7       # eta
//	outer_momentum = 0.9 # mu (DiLoCo) or beta (NoLoCo), in [0, 1)
//	nesterov = true      # DiLoCo: Nesterov outer momentum
//	delayed = false      # DiLoCo: overlap each round's exchange with the next phase; it lands a few steps in
//	group_size = 2       # NoLoCo: members averaged together, 2..16
//	gamma = 0.7          # NoLoCo: pull towards the group's mean weights
//
//	[wire]
//	codec = "minmax8" # "bf16", "fp16", "fp32", "int2", "int4", "int8", "minmax8" or "sign"
//	# outer = "support"     # DiLoCo, one stage: send only each round's shared support ("dense", the default: every coordinate)
//	# support_k = 1024      # with "support": coordinates of every 4096 sent each round, 1..4096
//	# residual_decay = 0.5  # with "support": decay per round of what a volunteer has not sent yet, [0, 1] (0: none)
//	# rotate = true         # with "support": the support in a randomized Hadamard basis of each 4096 coordinates
//	# block_size = 1024     # values sharing one scale in the blockwise codecs (0: 256)
//
//	[data]
//	source = "shards"      # "shards" (listed below) or "local" (each volunteer's own corpus)
//	val_fraction = 0.02    # held out for validation, in (0, 0.5)
//	shard_bytes = 67108864 # target shard size when the corpus was cut (64 MiB)
//	tokenizer = "byte"     # "byte" (one token per byte) or "gpt2" (GPT-2's BPE; the model takes its vocabulary)
//
//	# One entry per shard: the SHA-256 of its bytes, its size and its files.
//	[[data.shards]]
//	hash = "15c0f201cb87e86f96d52ed0ae05a262cc9bb6412c3ee93ae5b87d96122e444e"
//	bytes = 67108864
//	files = 112
//
//	[[data.shards]]
//	hash = "6c26c15631f11ae6bea043ea66a4a58e1abbdf95e87e987a45f6488a36712100"
//	bytes = 23462910
//	files = 40
//
//	[admission]
//	mode = "open"       # "open": anyone may join, within the caps; "closed": join tokens only
//	max_members = 256   # members at most, the bootstrap included, 1..65536
//	max_per_prefix = 16 # open runs: members behind one /24 (IPv4) or /48 (IPv6) prefix
//	# run_key = "..."   # closed runs: the run key's public half, as `skein token keygen` prints it
//
//	# Optional: a model split into pipeline stages (SkipPipe, CheckFree). Left
//	# out, the run is data parallel (stages = 1) and its hash is unchanged.
//	# [pipeline]
//	# stages = 3             # S: stage 0 (embedding, head, loss) and S-1 stages of layers
//	# skip_ratio = 0.3333333 # k: each microbatch visits S(1-k) stages (a whole number)
//	# microbatches = 4       # microbatches per step, each of model.batch sequences
//	# checkfree_plus = true  # swap stages 1, 2 on odd microbatches: edge stages become rebuildable
//
// # Admission
//
// An open run (the default) admits anyone, up to admission.max_members
// members and admission.max_per_prefix behind one /24 or /48 address
// prefix. A closed run admits only holders of a join token: the operator
// makes a run key once (`skein token keygen --out run.key`, kept off the
// bootstrap if they like), puts its public half in admission.run_key, and
// signs a token for each node's peer ID (`skein token issue`). The token
// format and where it is checked are in p2p/admission.go. Keys other than
// mode are written in the canonical bytes only when they differ from
// Default, so changing Default's caps would change what manifests that
// leave them out mean: that is a format change.
package manifest
