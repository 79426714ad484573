// Package data owns corpora, tokenization and deterministic sharding: it turns
// files on disk into batches of token ids that every node of a run can draw
// independently and reproducibly.
//
// data must not touch models, kernels, the optimizer or the network. It knows
// files and bytes; it never imports another Skein package.
//
// # Pieces
//
//   - Tokenizer maps bytes to ids and back. ByteTokenizer (vocabulary 256,
//     token = byte) is the default and the one the Loader's token stream uses.
//   - Corpus is an index over a sorted list of files (path, size, cumulative
//     offset). Files are never loaded whole: windows are read with ReadAt
//     through a small, bounded cache of open files.
//   - Each file belongs to the Train or the Validation split, chosen by a hash
//     of its slash-separated path relative to its corpus root, so the split
//     does not depend on where the corpus lives (for the default corpus, on
//     where Go is installed).
//   - Loader cuts a split's byte stream into W non-overlapping windows of T+1
//     tokens and serves batches as a pure function of (seed, worker, step).
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
package data
