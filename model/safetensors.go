package model

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
)

// The safetensors format (https://huggingface.co/docs/safetensors):
//
//	8 bytes     little-endian uint64 N, the header length
//	N bytes     UTF-8 JSON object: name -> {"dtype","shape","data_offsets":[begin,end]},
//	            plus an optional "__metadata__": {string: string}; padded with spaces
//	rest        the tensors' bytes; offsets are relative to the end of the header
//
// Skein writes only F32 tensors, little-endian, in layout order, with no gaps.

// Errors of the safetensors decoder; callers test them with errors.Is.
var (
	ErrMalformed = errors.New("model: malformed safetensors file")
	ErrTooLarge  = errors.New("model: safetensors file exceeds limit")
)

const (
	// MaxHeaderBytes bounds the JSON header the decoder will read.
	MaxHeaderBytes = 16 << 20
	maxTensors     = 1 << 16
	maxDims        = 8
)

// NamedTensor is one tensor of a safetensors file. Data aliases the caller's
// memory when writing.
type NamedTensor struct {
	Name  string
	Shape []int
	Data  []float32
}

type stEntry struct {
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// WriteSafetensors streams tensors and metadata to w in the safetensors
// format without copying the tensors whole.
func WriteSafetensors(w io.Writer, tensors []NamedTensor, metadata map[string]string) error {
	header := make(map[string]any, len(tensors)+1)
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	var off int64
	for _, t := range tensors {
		n := 1
		shape := make([]int64, len(t.Shape))
		for i, d := range t.Shape {
			n *= d
			shape[i] = int64(d)
		}
		if n != len(t.Data) {
			return fmt.Errorf("model: tensor %q has %d elements, shape %v says %d", t.Name, len(t.Data), t.Shape, n)
		}
		if _, dup := header[t.Name]; dup {
			return fmt.Errorf("model: duplicate tensor name %q", t.Name)
		}
		header[t.Name] = stEntry{DType: "F32", Shape: shape, DataOffsets: []int64{off, off + 4*int64(n)}}
		off += 4 * int64(n)
	}
	js, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("model: encoding safetensors header: %w", err)
	}
	for (8+len(js))%8 != 0 {
		js = append(js, ' ')
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(js)))
	bw.Write(lenBuf[:])
	bw.Write(js)
	var buf [4096]byte
	for _, t := range tensors {
		for i := 0; i < len(t.Data); i += len(buf) / 4 {
			chunk := t.Data[i:min(i+len(buf)/4, len(t.Data))]
			for j, v := range chunk {
				binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(v))
			}
			if _, err := bw.Write(buf[:4*len(chunk)]); err != nil {
				return fmt.Errorf("model: writing tensor %q: %w", t.Name, err)
			}
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("model: writing safetensors: %w", err)
	}
	return nil
}

// STHeader is a decoded, validated safetensors header.
type STHeader struct {
	Metadata map[string]string
	Tensors  []STTensorInfo // sorted by data offset
	dataBase int64
}

// STTensorInfo locates one tensor in a file.
type STTensorInfo struct {
	Name       string
	Shape      []int
	Begin, End int64 // byte offsets relative to the data section
}

// ReadSafetensorsHeader reads and validates the header of a file of the
// given size: every offset lies inside the file, tensors do not overlap and
// cover the data section exactly, and every tensor is F32 with a consistent
// byte length. maxBytes bounds the total tensor bytes (0: no bound beyond the
// file size). Nothing is allocated beyond the header's declared length, which
// is itself checked against MaxHeaderBytes and the file size first.
func ReadSafetensorsHeader(r io.ReaderAt, size, maxBytes int64) (*STHeader, error) {
	if size < 8 {
		return nil, fmt.Errorf("%w: %d bytes is shorter than the 8-byte length prefix", ErrMalformed, size)
	}
	var lenBuf [8]byte
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("%w: reading header length: %v", ErrMalformed, err)
	}
	hlen := binary.LittleEndian.Uint64(lenBuf[:])
	if hlen > MaxHeaderBytes {
		return nil, fmt.Errorf("%w: header of %d bytes (limit %d)", ErrTooLarge, hlen, MaxHeaderBytes)
	}
	if int64(hlen) > size-8 {
		return nil, fmt.Errorf("%w: header of %d bytes but the file has %d (truncated?)", ErrMalformed, hlen, size)
	}
	js := make([]byte, hlen)
	if _, err := r.ReadAt(js, 8); err != nil {
		return nil, fmt.Errorf("%w: reading header: %v", ErrMalformed, err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(js, &raw); err != nil {
		return nil, fmt.Errorf("%w: header is not a JSON object: %v", ErrMalformed, err)
	}
	if len(raw) > maxTensors {
		return nil, fmt.Errorf("%w: %d header entries (limit %d)", ErrTooLarge, len(raw), maxTensors)
	}
	h := &STHeader{dataBase: 8 + int64(hlen)}
	dataLen := size - h.dataBase
	if maxBytes > 0 && dataLen > maxBytes {
		return nil, fmt.Errorf("%w: %d bytes of tensor data (limit %d)", ErrTooLarge, dataLen, maxBytes)
	}
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &h.Metadata); err != nil {
				return nil, fmt.Errorf("%w: __metadata__ is not a string map: %v", ErrMalformed, err)
			}
			continue
		}
		var e stEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, fmt.Errorf("%w: tensor %q: %v", ErrMalformed, name, err)
		}
		if e.DType != "F32" {
			return nil, fmt.Errorf("%w: tensor %q has dtype %q; only F32 is supported", ErrMalformed, name, e.DType)
		}
		if len(e.Shape) > maxDims {
			return nil, fmt.Errorf("%w: tensor %q has %d dimensions (limit %d)", ErrMalformed, name, len(e.Shape), maxDims)
		}
		if len(e.DataOffsets) != 2 {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets must have 2 entries", ErrMalformed, name)
		}
		elems := int64(1)
		shape := make([]int, len(e.Shape))
		for i, d := range e.Shape {
			if d < 0 || d > dataLen/4+1 {
				return nil, fmt.Errorf("%w: tensor %q: dimension %d out of range", ErrMalformed, name, d)
			}
			if d != 0 && elems > (dataLen/4+1)/d {
				return nil, fmt.Errorf("%w: tensor %q: shape %v larger than the file", ErrMalformed, name, e.Shape)
			}
			elems *= d
			shape[i] = int(d)
		}
		b, en := e.DataOffsets[0], e.DataOffsets[1]
		if b < 0 || en < b || en > dataLen {
			return nil, fmt.Errorf("%w: tensor %q: data offsets [%d, %d) outside the %d-byte data section", ErrMalformed, name, b, en, dataLen)
		}
		if en-b != 4*elems {
			return nil, fmt.Errorf("%w: tensor %q: %d bytes for shape %v (want %d)", ErrMalformed, name, en-b, e.Shape, 4*elems)
		}
		h.Tensors = append(h.Tensors, STTensorInfo{Name: name, Shape: shape, Begin: b, End: en})
	}
	sort.Slice(h.Tensors, func(i, j int) bool {
		if h.Tensors[i].Begin != h.Tensors[j].Begin {
			return h.Tensors[i].Begin < h.Tensors[j].Begin
		}
		return h.Tensors[i].Name < h.Tensors[j].Name
	})
	var pos int64
	for _, t := range h.Tensors {
		if t.Begin != pos {
			return nil, fmt.Errorf("%w: tensor %q starts at byte %d, expected %d (gap or overlap)", ErrMalformed, t.Name, t.Begin, pos)
		}
		pos = t.End
	}
	if pos != dataLen {
		return nil, fmt.Errorf("%w: tensors cover %d of %d data bytes (truncated or trailing bytes)", ErrMalformed, pos, dataLen)
	}
	return h, nil
}

// ReadTensor reads tensor t's elements into dst, whose length must match.
func (h *STHeader) ReadTensor(r io.ReaderAt, t STTensorInfo, dst []float32) error {
	if int64(len(dst))*4 != t.End-t.Begin {
		return fmt.Errorf("model: tensor %q has %d elements, destination %d", t.Name, (t.End-t.Begin)/4, len(dst))
	}
	var buf [1 << 14]byte
	off := h.dataBase + t.Begin
	for i := 0; i < len(dst); {
		n := min(len(buf)/4, len(dst)-i)
		if _, err := r.ReadAt(buf[:4*n], off); err != nil {
			return fmt.Errorf("%w: reading tensor %q: %v", ErrMalformed, t.Name, err)
		}
		for j := 0; j < n; j++ {
			dst[i+j] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*j:]))
		}
		i += n
		off += int64(4 * n)
	}
	return nil
}
