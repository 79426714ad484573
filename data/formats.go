package data

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"path"
	"strings"
)

// Dataset formats a TokenizedCorpus reads, by the file's extension:
//
//   - .jsonl: one JSON object per line; its "text" string is a document
//     (empty lines are skipped; a line that is not an object with a
//     string "text" is an error naming the file and line).
//   - .bin: llm.c's tokenized files: a header of 256 little-endian int32
//     (magic 20240520, version 1, the token count), then the tokens as
//     uint16; they are GPT-2 ids and are taken as they are (the run's
//     tokenizer must be gpt2). Sizes are checked before anything is read.
//   - anything else: the file's bytes are one document.
const (
	llmcMagic      = 20240520
	llmcVersion    = 1
	llmcHeaderInts = 256
	llmcHeader     = 4 * llmcHeaderInts
	// JSONLField is the key of a JSONL record's text.
	JSONLField = "text"
)

// fileFormat is the format of a corpus file named rel.
func fileFormat(rel string) string {
	switch strings.ToLower(path.Ext(rel)) {
	case ".jsonl":
		return "jsonl"
	case ".bin":
		return "llmc"
	}
	return "text"
}

// jsonlDocuments calls doc with the text of each record of b, a JSONL file
// named name.
func jsonlDocuments(name string, b []byte, doc func([]byte)) error {
	line := 0
	for len(b) > 0 {
		line++
		var l []byte
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			l, b = b[:i], b[i+1:]
		} else {
			l, b = b, nil
		}
		if len(bytes.TrimSpace(l)) == 0 {
			continue
		}
		var rec map[string]json.RawMessage
		if err := json.Unmarshal(l, &rec); err != nil {
			return fmt.Errorf("data: %s line %d: %v: %w", name, line, err, ErrDataFormat)
		}
		raw, ok := rec[JSONLField]
		var text string
		if ok {
			if err := json.Unmarshal(raw, &text); err != nil {
				ok = false
			}
		}
		if !ok {
			return fmt.Errorf("data: %s line %d: no string %q: %w", name, line, JSONLField, ErrDataFormat)
		}
		doc([]byte(text))
	}
	return nil
}

// llmcCount checks the header of an llm.c .bin file of size bytes named
// name and returns its token count.
func llmcCount(name string, hdr []byte, size int64) (int64, error) {
	magic := int32(binary.LittleEndian.Uint32(hdr[0:]))
	version := int32(binary.LittleEndian.Uint32(hdr[4:]))
	n := int64(int32(binary.LittleEndian.Uint32(hdr[8:])))
	switch {
	case magic != llmcMagic:
		return 0, fmt.Errorf("data: %s: magic %d, not llm.c's %d: %w", name, magic, llmcMagic, ErrDataFormat)
	case version != llmcVersion:
		return 0, fmt.Errorf("data: %s: llm.c version %d, want %d (uint16 GPT-2 tokens): %w", name, version, llmcVersion, ErrDataFormat)
	case n < 0 || int64(llmcHeader)+2*n != size:
		return 0, fmt.Errorf("data: %s: the header says %d tokens, the file holds %d bytes after it: %w", name, n, size-llmcHeader, ErrDataFormat)
	}
	return n, nil
}

// llmcTokens checks b, an llm.c .bin file named name, and returns its
// tokens' bytes (uint16 little-endian) and their count.
func llmcTokens(name string, b []byte) ([]byte, int, error) {
	if len(b) < llmcHeader {
		return nil, 0, fmt.Errorf("data: %s: %d bytes, shorter than llm.c's %d-byte header: %w", name, len(b), llmcHeader, ErrDataFormat)
	}
	n, err := llmcCount(name, b[:llmcHeader], int64(len(b)))
	if err != nil {
		return nil, 0, err
	}
	return b[llmcHeader:], int(n), nil
}
