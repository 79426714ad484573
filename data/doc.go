// Package data owns corpora, tokenization and deterministic sharding: it turns
// files on disk into batches of token ids that every node of a run can draw
// independently and reproducibly. It also owns the storage side of a corpus
// that travels with the run: content-addressed shards, their on-disk store
// and resumable downloads into it.
//
// data must not touch models, kernels, the optimizer or the network. It knows
// files and bytes; it never imports another Skein package. Moving shards
// between members is the caller's job, through the ShardFetcher it passes.
//
// # Pieces
//
//   - Tokenizer maps bytes to ids and back. ByteTokenizer (vocabulary 256,
//     token = byte) is the default and the one the Loader's token stream uses.
//     GPT2Tokenizer is OpenAI's GPT-2 byte-level BPE (vocabulary 50257, the
//     ids of tiktoken's "gpt2"). NewTokenizer makes either by name ("byte",
//     "gpt2"); both are Named, with a VocabHash for manifests to check (see
//     Tokenizers below).
//   - Corpus is an index over a sorted list of files (path, size, cumulative
//     offset; for a corpus from shards, the shard and the offset inside it).
//     Files are never loaded whole: windows are read with ReadAt through a
//     small, bounded cache of open files.
//   - Each file belongs to the Train or the Validation split, chosen by a hash
//     of its slash-separated path relative to its corpus root, so the split
//     does not depend on where the corpus lives (for the default corpus, on
//     where Go is installed).
//   - Loader cuts a split's byte stream into W non-overlapping windows of T+1
//     tokens and serves batches as a pure function of (seed, worker, step).
//   - PackShards packs a corpus into shards named by the SHA-256 of their
//     bytes; a ShardStore holds them on a volunteer, downloads them
//     resumably (PartialShard, Download) and serves them (Open, ShardKey);
//     OpenShards opens a Corpus from them that trains exactly like the
//     packed one.
//
// # The sampling contract
//
// Sample number k = (step*Workers + worker)*B + b reads window
// Permutation(W, seed, epoch).At(k mod W), with epoch = k / W. The
// permutation is a Feistel network with cycle walking: a bijection of [0, W)
// in O(1) memory, re-keyed every epoch. Consequently:
//
//  1. The same (seed, worker, step) always yields the same batch.
//  2. Within an epoch no window is drawn twice, across all steps and all
//     Workers workers: M workers with the same seed draw disjoint streams.
//  3. Targets are the inputs shifted by one token; a window holds T+1 tokens.
//  4. Validation batches (NewValidationLoader) come from files that the
//     training split never contains, with a fixed seed.
//
// Quick start:
//
//	c, err := data.OpenDefault() // the Go standard library's .go sources
//	if err != nil { ... }
//	defer c.Close()
//	l, err := data.NewLoader(c, data.Train, data.LoaderConfig{Seed: 1, Workers: 1, B: 8, T: 256})
//	if err != nil { ... }
//	in, tg := make([]int32, 8*256), make([]int32, 8*256)
//	for step := 0; ; step++ {
//		if err := l.Batch(step, in, tg); err != nil { ... }
//	}
//
// # Tokenizers
//
// Every tokenizer encodes every byte of its input, and Decode(Encode(p)) is
// p for any bytes p. A Named tokenizer's VocabHash is the SHA-256 of its rank
// table written as tiktoken writes one (for each rank r, the line
// "base64(token r) r\n"): ByteVocabHash for byte, GPT2VocabHash for gpt2,
// which is the hash OpenAI publishes for r50k_base.tiktoken.
//
// GPT2Tokenizer embeds the rank table (gpt2_ranks.zst, written by
// gen_gpt2_ranks.go from OpenAI's encoder.json and vocab.bpe; both inputs and
// the result are checked against OpenAI's published hashes). Encoding is
// tiktoken's:
//
//  1. A hand-written pre-tokenizer cuts the text where GPT-2's pattern
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     does, with Rust regex's classes: \s is Unicode White_Space (U+0085 is
//     space, U+FEFF is not), letters and numbers are Go's unicode tables
//     (Unicode 15.0). A byte that is not valid UTF-8 is a character of
//     class [^\s\p{L}\p{N}].
//  2. A piece that is a token is that token. Otherwise, while two adjacent
//     parts concatenate to a token, the pair whose token has the lowest rank
//     merges, the leftmost of equals; the parts start as single bytes.
//  3. <|endoftext|> is ordinary text for Encode. EncodeSpecial (the
//     SpecialEncoder interface) makes each occurrence id 50256 and encodes
//     the text between occurrences stretch by stretch.
//
// Pieces that took merges are remembered in bounded caches, one per
// concurrent Encode (a sync.Pool); a GPT2Tokenizer is safe for concurrent
// use.
//
// # Shards
//
// The operator packs the corpus once; the run manifest lists the shards as
// ShardInfo{Hash, Bytes, Files} in packing order; every volunteer fetches
// them, verifies each hash and opens the same corpus:
//
//	shards, err := data.PackShards(c, dir, 0) // operator: 4 MiB shards in dir
//
//	store, err := data.OpenShardStore(filepath.Join(dataDir, "shards"))
//	for _, info := range shards {
//		err := store.Download(ctx, info, fetchFromSomeMember) // resumes; retry on error
//	}
//	c, err := data.OpenShards(store, shards, data.ShardCorpusConfig{ValFraction: v})
//
// The corpus from shards has the packed corpus's files under the same keys in
// the same order, so with the same ValFraction it has the same split, the
// same split streams, the same Fingerprint (keys, sizes and splits; not
// paths) and the same Loader batches. Only File.Path (the shard) and
// File.Offset (the position inside it) differ.
//
// A shard is a container of whole files; all integers are little-endian:
//
//	offset  size  field
//	0       8     magic "SKSHARD1" (the final byte is the format version)
//	8       4     N, the file count (uint32), in [1, MaxShardFiles]
//	12            N entries, in non-decreasing byte order of key:
//	        2       key length K (uint16), in [1, MaxKeyBytes]
//	        K       key: the file's slash-separated path relative to the
//	                corpus root, valid UTF-8, no NUL, no leading or trailing
//	                slash, no empty, "." or ".." element (ValidKey)
//	        8       file size S (uint64), >= 1
//	H             the files' bytes, concatenated in entry order, no padding
//
// H = 12 + sum(10 + K), and H + sum(S) is exactly the shard's size, at most
// MaxShardBytes: nothing may follow the last file. A file's bytes start at H
// plus the sizes of the files before it. ReadShardIndex checks every length
// against the shard's size before using it. The shard's name is the SHA-256
// of all its bytes in lowercase hex; members serve it under the bulk key
// ShardKey(hash) = "shard/<hash>".
//
// Packing is deterministic: files in corpus order (sorted by key), a shard
// filled while its size stays within the target, a file never split, a file
// larger than the target alone in its shard. The same corpus and target give
// the same shards and hashes on every machine.
//
// # Downloads and resumption
//
// A download is <hash>.part in the store, written at the shard's offsets in
// any order. The fetcher reports the contiguous prefix it completed and
// PartialShard.Confirm records it: the part file is fsynced, then <hash>.have
// (magic "SKPART1\n", shard size, prefix; uint64s) is replaced atomically.
// On restart Partial resumes at the recorded prefix (never beyond the part
// file's length); bytes past it are fetched again. Commit installs the
// download as <hash>.shard only when all bytes are confirmed and the whole
// file hashes to its name; otherwise the download is deleted and
// ErrShardCorrupt returned, so corrupt bytes are never installed. An
// installed shard is hashed again the first time a process opens or serves it
// (Has checks only its size; Verify always hashes) and deleted if it no
// longer matches.
package data
