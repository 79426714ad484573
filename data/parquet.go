package data

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/snappy"
	"github.com/klauspost/compress/zstd"
	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"
	"github.com/pierrec/lz4/v4"
)

// MaxDocumentBytes is the longest document any dataset reader accepts.
const MaxDocumentBytes = 256 << 20

// Parquet reading. parquet-go parses the footer and the page headers (its
// format and thrift packages); the pages of the one column read are
// decompressed and decoded here, because parquet-go's own page reader
// sizes its buffers from header fields it does not check (a corrupt
// LZ4_RAW page makes it double its buffer until the process dies, a
// DELTA_BYTE_ARRAY page can ask for terabytes), and an out-of-memory
// crash cannot be recovered. Every size below is checked against the
// bytes that back it before anything is allocated:
//
//   - the footer is walked (pqScanThrift) before it is decoded: no list
//     longer than the bytes left, no nesting deeper than pqThriftDepth,
//     and the decoded lists together at most 64 MiB plus 64 bytes per
//     footer byte;
//   - a column chunk lies inside the file, a page inside its chunk, a
//     page's sizes are at most pqMaxPageBytes, and what a page says it
//     decompresses to is what its codec can produce from its bytes (the
//     streaming codecs, gzip and brotli, grow their output as it comes);
//   - levels, dictionary indexes and DELTA lengths are decoded one run at
//     a time, never into a slice sized by a count read from the file.
//
// Memory is then about one compressed page, one decompressed page and the
// column chunk's dictionary page.
const (
	// pqMaxPageBytes bounds a page's compressed and uncompressed size.
	pqMaxPageBytes = 1 << 30
	// pqMaxHeaderBytes bounds a page header: the header of a page can hold
	// its smallest and largest value as statistics.
	pqMaxHeaderBytes = 2*MaxDocumentBytes + 1<<20
	// pqHeaderWindow is how much is read to decode a page header first.
	pqHeaderWindow = 64 << 10
	// pqReadAhead is the smallest read from the file.
	pqReadAhead = 256 << 10
	// pqThriftDepth bounds the nesting of thrift structs and lists.
	pqThriftDepth = 64
	// pqStructCost bounds the size of a struct that parquet-go decodes a
	// thrift list element into (format.ColumnChunk, 560 bytes, is the
	// largest; TestParquetThriftCost checks).
	pqStructCost = 768
	// pqBatch is how many rows are read between checks of the context.
	pqBatch = 1024
)

// ParquetDocuments calls doc with the text of each row of a Parquet file,
// in row order: the value of the column named field (a top-level, optional
// or required, BYTE_ARRAY / string column). r and size are the file; name
// is how errors name it. row is the 1-based row number, as errors name it.
// text is only valid during the call: the next call may reuse it, so doc
// copies what it keeps.
//
// A row whose value is null, or that is longer than MaxDocumentBytes, is
// a bad record: the error wraps ErrDataFormat and names the file and the
// 1-based row ("data: NAME row 12: ..."); if skipBad is true such a row is
// skipped instead and counted in skipped. A file that is not Parquet, is
// truncated or malformed, or has no such column (or one that is not a
// byte array) is an error wrapping ErrDataFormat naming the file; it
// never panics. The pages are decoded one at a time (memory stays within
// about two pages and the column chunk's dictionary; see pqMaxPageBytes),
// and ctx is checked every page and every pqBatch rows. doc's error stops
// the read and is returned as is; so is ctx's. Compression codecs: none,
// SNAPPY, GZIP, BROTLI, ZSTD and LZ4_RAW; encodings: PLAIN, dictionary,
// DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY; pages: v1 and v2.
func ParquetDocuments(ctx context.Context, r io.ReaderAt, size int64, name, field string, skipBad bool,
	doc func(row int64, text []byte) error) (skipped int64, err error) {
	p := &pqReader{ctx: ctx, name: name, field: field, skipBad: skipBad, doc: doc}
	p.chunk.r = r
	defer func() {
		if p.zstd != nil {
			p.zstd.Close()
		}
	}()
	defer func() {
		if v := recover(); v != nil {
			if p.inDoc {
				panic(v)
			}
			err = p.errorf("malformed Parquet file (decoder panic: %v)", v)
		}
		skipped = p.skipped
	}()
	return 0, p.read(r, size)
}

// pqReader is the state of one ParquetDocuments call.
type pqReader struct {
	ctx     context.Context
	name    string
	field   string
	skipBad bool
	doc     func(row int64, text []byte) error
	inDoc   bool // doc is running: its panics are not the file's

	row     int64 // rows read
	batch   int   // rows since the context was checked
	skipped int64

	rowGroup int // the row group being read, for errors
	pageEnd  int64
	chunk    pqChunk
	out      []byte // decompressed data page, reused
	zstd     *zstd.Decoder
}

// errorf is a format error naming the file.
func (p *pqReader) errorf(format string, args ...any) error {
	return fmt.Errorf("data: %s: %s: %w", p.name, fmt.Sprintf(format, args...), ErrDataFormat)
}

// chunkErrorf is a format error naming the file and the row group.
func (p *pqReader) chunkErrorf(format string, args ...any) error {
	return fmt.Errorf("data: %s: row group %d, column %q: %s: %w", p.name, p.rowGroup, p.field, fmt.Sprintf(format, args...), ErrDataFormat)
}

// rowErrorf is a format error naming the file and a 1-based row.
func (p *pqReader) rowErrorf(row int64, format string, args ...any) error {
	return fmt.Errorf("data: %s row %d: %s: %w", p.name, row, fmt.Sprintf(format, args...), ErrDataFormat)
}

// pqReadAt fills b from offset off of the file.
func pqReadAt(r io.ReaderAt, b []byte, off int64) error {
	n, err := r.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// ioError turns a failed read into an error: a short file is a format
// error (the file is shorter than its size says), anything else is the
// reader's error.
func (p *pqReader) ioError(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return p.errorf("truncated: the file ends early")
	}
	return fmt.Errorf("data: %s: %w", p.name, err)
}

// read checks the file's frame, decodes its footer and reads the column's
// chunk in every row group.
func (p *pqReader) read(r io.ReaderAt, size int64) error {
	if err := p.ctx.Err(); err != nil {
		return err
	}
	if size < 12 {
		return p.errorf("%d bytes, too short for a Parquet file", size)
	}
	var head [4]byte
	var tail [8]byte
	if err := pqReadAt(r, head[:], 0); err != nil {
		return p.ioError(err)
	}
	if err := pqReadAt(r, tail[:], size-8); err != nil {
		return p.ioError(err)
	}
	if string(head[:]) != "PAR1" || string(tail[4:]) != "PAR1" {
		if string(head[:]) == "PARE" || string(tail[4:]) == "PARE" {
			return p.errorf("encrypted Parquet files are not supported")
		}
		return p.errorf("not a Parquet file (no PAR1 magic at both ends; truncated?)")
	}
	footerLen := int64(binary.LittleEndian.Uint32(tail[:4]))
	if footerLen > size-12 {
		return p.errorf("footer of %d bytes does not fit in the file's %d", footerLen, size)
	}
	footer := make([]byte, footerLen)
	if err := pqReadAt(r, footer, size-8-footerLen); err != nil {
		return p.ioError(err)
	}
	n, err := pqScanThrift(footer, 64<<20+64*footerLen)
	if err != nil {
		return p.errorf("footer: %v", err)
	}
	if n != len(footer) {
		return p.errorf("footer: %d bytes after the metadata (a signed, encrypted footer?)", len(footer)-n)
	}
	var md format.FileMetaData
	if err := thrift.Unmarshal(new(thrift.CompactProtocol), footer, &md); err != nil {
		return p.errorf("footer: %v", err)
	}
	leaf, leaves, optional, err := p.findColumn(md.Schema)
	if err != nil {
		return err
	}
	p.pageEnd = size - 8 - footerLen
	for i := range md.RowGroups {
		p.rowGroup = i
		rg := &md.RowGroups[i]
		if len(rg.Columns) != leaves {
			return p.chunkErrorf("%d column chunks for the schema's %d columns", len(rg.Columns), leaves)
		}
		if rg.NumRows < 0 {
			return p.chunkErrorf("%d rows", rg.NumRows)
		}
		if err := p.readChunk(&rg.Columns[leaf], rg.NumRows, optional); err != nil {
			return err
		}
	}
	return nil
}

// findColumn finds the top-level column named p.field in schema: its leaf
// index (its column chunk in each row group), the schema's number of
// leaves, and whether it is optional.
func (p *pqReader) findColumn(schema []format.SchemaElement) (leaf, leaves int, optional bool, err error) {
	if len(schema) == 0 || schema[0].Type.Valid {
		return 0, 0, false, p.errorf("footer: no root group in the schema")
	}
	var found *format.SchemaElement
	var names []string
	i := 1
	for range max(schema[0].NumChildren.V, 0) {
		if i >= len(schema) {
			return 0, 0, false, p.errorf("footer: schema ends inside the root group")
		}
		el := &schema[i]
		if el.Name == p.field && found == nil {
			found, leaf = el, leaves
		}
		if len(names) < 10 {
			names = append(names, el.Name)
		}
		// Skip el's subtree, counting its leaves.
		for open := 1; open > 0; open-- {
			if i >= len(schema) {
				return 0, 0, false, p.errorf("footer: schema ends inside a group")
			}
			el := &schema[i]
			i++
			switch n := el.NumChildren.V; {
			case el.Type.Valid && n > 0:
				return 0, 0, false, p.errorf("footer: schema column %q has a type and %d children", el.Name, n)
			case el.Type.Valid:
				leaves++
			case int(n) > len(schema):
				return 0, 0, false, p.errorf("footer: schema group %q has %d children, the schema %d elements", el.Name, n, len(schema))
			case n > 0:
				open += int(n)
			}
		}
	}
	if i != len(schema) {
		return 0, 0, false, p.errorf("footer: %d schema elements outside the root group", len(schema)-i)
	}
	switch {
	case found == nil:
		if len(names) == 10 {
			names[9] = "..."
		}
		return 0, 0, false, p.errorf("no column %q (columns: %s)", p.field, strings.Join(names, ", "))
	case !found.Type.Valid:
		return 0, 0, false, p.errorf("column %q is a group, not a string column", p.field)
	case found.Type.V != format.ByteArray:
		return 0, 0, false, p.errorf("column %q is %v, not a string (BYTE_ARRAY) column", p.field, found.Type.V)
	case found.RepetitionType.V == format.Repeated:
		return 0, 0, false, p.errorf("column %q is repeated, not one string per row", p.field)
	}
	return leaf, leaves, found.RepetitionType.V == format.Optional, nil
}

// pqDict is a dictionary page: value i is the PLAIN byte array at pos[i].
type pqDict struct {
	data []byte
	pos  []uint32
}

// value returns dictionary value i.
func (d *pqDict) value(i uint64) ([]byte, bool) {
	if i >= uint64(len(d.pos)) {
		return nil, false
	}
	p := d.pos[i]
	n := binary.LittleEndian.Uint32(d.data[p:])
	return d.data[p+4 : p+4+n], true
}

// readChunk reads the pages of column chunk c, which holds rows rows.
func (p *pqReader) readChunk(c *format.ColumnChunk, rows int64, optional bool) error {
	md := &c.MetaData
	switch {
	case c.FilePath != "":
		return p.chunkErrorf("the data is in another file, %q", c.FilePath)
	case c.CryptoMetadata.Value != nil || len(c.EncryptedColumnMetadata) > 0:
		return p.chunkErrorf("encrypted columns are not supported")
	case md.Type != format.ByteArray:
		return p.chunkErrorf("the column chunk is %v, the schema says BYTE_ARRAY", md.Type)
	}
	start := md.DataPageOffset
	if d := md.DictionaryPageOffset; d > 0 && d < start {
		start = d
	}
	size := md.TotalCompressedSize
	if start < 4 || size < 0 || start > p.pageEnd || size > p.pageEnd-start {
		return p.chunkErrorf("%d bytes at offset %d, outside the file's pages (bytes 4 to %d)", size, start, p.pageEnd)
	}
	p.chunk.reset(start, start+size)
	var dict *pqDict
	read := int64(0)
	for p.chunk.pos < p.chunk.end {
		if err := p.ctx.Err(); err != nil {
			return err
		}
		p.batch = 0
		h, body, err := p.nextPage()
		if err != nil {
			return err
		}
		switch h.Type {
		case format.DictionaryPage:
			if dict != nil {
				return p.chunkErrorf("a second dictionary page")
			}
			if dict, err = p.dictionaryPage(h, body, md.Codec); err != nil {
				return err
			}
		case format.DataPage, format.DataPageV2:
			n, err := p.dataPage(h, body, md.Codec, optional, dict, rows-read)
			if err != nil {
				return err
			}
			read += n
		case format.IndexPage:
		default:
			return p.chunkErrorf("page type %v", h.Type)
		}
	}
	if read != rows {
		return p.chunkErrorf("pages hold %d values, the row group %d rows", read, rows)
	}
	return nil
}

// nextPage reads the next page header of the chunk and the page's bytes.
// The bytes are valid until the next call.
func (p *pqReader) nextPage() (*format.PageHeader, []byte, error) {
	c := &p.chunk
	left := c.end - c.pos
	window := min(left, pqHeaderWindow)
	var n int
	for {
		if err := c.fill(int(window)); err != nil {
			return nil, nil, p.ioError(err)
		}
		var err error
		n, err = pqScanThrift(c.buf[c.lo:c.lo+int(window)], 1<<20)
		if err == pqErrShort && window < left && window < pqMaxHeaderBytes {
			window = min(left, 4*window, pqMaxHeaderBytes)
			continue
		}
		if err != nil {
			return nil, nil, p.chunkErrorf("page header at offset %d: %v", c.pos, err)
		}
		break
	}
	h := new(format.PageHeader)
	if err := thrift.Unmarshal(new(thrift.CompactProtocol), c.buf[c.lo:c.lo+n], h); err != nil {
		return nil, nil, p.chunkErrorf("page header at offset %d: %v", c.pos, err)
	}
	size := int64(h.CompressedPageSize)
	switch {
	case size < 0 || size > left-int64(n):
		return nil, nil, p.chunkErrorf("page at offset %d: %d bytes, %d left in the column chunk", c.pos, size, left-int64(n))
	case size > pqMaxPageBytes || h.UncompressedPageSize < 0 || h.UncompressedPageSize > pqMaxPageBytes:
		return nil, nil, p.chunkErrorf("page at offset %d: %d bytes, %d uncompressed (at most %d)", c.pos, size, h.UncompressedPageSize, pqMaxPageBytes)
	}
	if err := c.fill(n + int(size)); err != nil {
		return nil, nil, p.ioError(err)
	}
	body := c.buf[c.lo+n : c.lo+n+int(size)]
	if h.CRC != 0 && crc32.ChecksumIEEE(body) != uint32(h.CRC) {
		return nil, nil, p.chunkErrorf("page at offset %d: checksum mismatch", c.pos)
	}
	c.lo += n + int(size)
	c.pos += int64(n) + size
	return h, body, nil
}

// dictionaryPage decodes a dictionary page.
func (p *pqReader) dictionaryPage(h *format.PageHeader, body []byte, codec format.CompressionCodec) (*pqDict, error) {
	if !h.DictionaryPageHeader.Valid {
		return nil, p.chunkErrorf("dictionary page without its header")
	}
	dh := &h.DictionaryPageHeader.V
	if dh.Encoding != format.Plain && dh.Encoding != format.PlainDictionary {
		return nil, p.chunkErrorf("dictionary page encoding %v", dh.Encoding)
	}
	var data []byte
	if codec == format.Uncompressed {
		data = bytes.Clone(body)
	} else {
		var err error
		if data, err = p.decompress(codec, body, int(h.UncompressedPageSize), nil); err != nil {
			return nil, p.chunkErrorf("dictionary page: %v", err)
		}
	}
	n := int64(dh.NumValues)
	if n < 0 || 4*n > int64(len(data)) {
		return nil, p.chunkErrorf("dictionary page: %d values in %d bytes", n, len(data))
	}
	d := &pqDict{data: data, pos: make([]uint32, n)}
	off := 0
	for i := range d.pos {
		if len(data)-off < 4 {
			return nil, p.chunkErrorf("dictionary page: value %d: truncated", i)
		}
		l := int64(binary.LittleEndian.Uint32(data[off:]))
		if l > int64(len(data)-off-4) {
			return nil, p.chunkErrorf("dictionary page: value %d: %d bytes, %d left", i, l, len(data)-off-4)
		}
		d.pos[i] = uint32(off)
		off += 4 + int(l)
	}
	return d, nil
}

// dataPage decodes a data page and calls doc for its rows. It returns the
// number of rows, at most left.
func (p *pqReader) dataPage(h *format.PageHeader, body []byte, codec format.CompressionCodec, optional bool, dict *pqDict, left int64) (int64, error) {
	maxDef := uint64(0)
	if optional {
		maxDef = 1
	}
	// Without definition levels every value is defined.
	levels := pqLevels{all: true, def: maxDef}
	var (
		n      int64
		enc    format.Encoding
		values []byte
		err    error
	)
	if h.Type == format.DataPage {
		if !h.DataPageHeader.Valid {
			return 0, p.chunkErrorf("data page without its header")
		}
		dh := &h.DataPageHeader.V
		n, enc = int64(dh.NumValues), dh.Encoding
		if n < 0 || n > left {
			return 0, p.chunkErrorf("a page of %d values, %d rows left in the row group", n, left)
		}
		values = body
		if codec != format.Uncompressed {
			if values, err = p.decompress(codec, body, int(h.UncompressedPageSize), p.out); err != nil {
				return 0, p.chunkErrorf("data page: %v", err)
			}
			p.out = values
		}
		if optional {
			switch dh.DefinitionLevelEncoding {
			case format.RLE:
				if len(values) < 4 {
					return 0, p.chunkErrorf("data page: truncated definition levels")
				}
				l := int64(binary.LittleEndian.Uint32(values))
				if l > int64(len(values)-4) {
					return 0, p.chunkErrorf("data page: %d bytes of definition levels, %d in the page", l, len(values)-4)
				}
				levels = pqLevels{rle: pqRLE{b: values[4 : 4+l], width: 1}}
				values = values[4+l:]
			case format.BitPacked:
				l := (n + 7) / 8
				if l > int64(len(values)) {
					return 0, p.chunkErrorf("data page: %d bit-packed definition levels, %d bytes in the page", n, len(values))
				}
				levels = pqLevels{packed: values[:l]}
				values = values[l:]
			default:
				return 0, p.chunkErrorf("data page: definition level encoding %v", dh.DefinitionLevelEncoding)
			}
		}
	} else {
		if !h.DataPageHeaderV2.Valid {
			return 0, p.chunkErrorf("data page v2 without its header")
		}
		dh := &h.DataPageHeaderV2.V
		n, enc = int64(dh.NumValues), dh.Encoding
		if n < 0 || n > left {
			return 0, p.chunkErrorf("a page of %d values, %d rows left in the row group", n, left)
		}
		rl, dl := int64(dh.RepetitionLevelsByteLength), int64(dh.DefinitionLevelsByteLength)
		if rl < 0 || dl < 0 || rl+dl > int64(len(body)) {
			return 0, p.chunkErrorf("data page v2: %d+%d bytes of levels, %d in the page", rl, dl, len(body))
		}
		switch {
		case optional && dl > 0:
			levels = pqLevels{rle: pqRLE{b: body[rl : rl+dl], width: 1}}
		case optional && dh.NumNulls != 0:
			return 0, p.chunkErrorf("data page v2: %d nulls and no definition levels", dh.NumNulls)
		}
		values = body[rl+dl:]
		if codec != format.Uncompressed && (!dh.IsCompressed.Valid || dh.IsCompressed.V) {
			size := int64(h.UncompressedPageSize) - rl - dl
			if size < 0 {
				return 0, p.chunkErrorf("data page v2: %d bytes uncompressed, %d of them levels", h.UncompressedPageSize, rl+dl)
			}
			if values, err = p.decompress(codec, values, int(size), p.out); err != nil {
				return 0, p.chunkErrorf("data page v2: %v", err)
			}
			p.out = values
		}
	}
	var vals pqValues
	if err := vals.init(enc, values, dict); err != nil {
		return 0, p.chunkErrorf("data page: %v", err)
	}
	for todo := n; todo > 0; {
		level, count, err := levels.run()
		if err != nil {
			return 0, p.rowErrorf(p.row+1, "definition levels: %v", err)
		}
		count = min(count, todo)
		todo -= count
		switch {
		case level > maxDef:
			return 0, p.rowErrorf(p.row+1, "definition level %d", level)
		case level < maxDef:
			if !p.skipBad {
				return 0, p.rowErrorf(p.row+1, "null %s", p.field)
			}
			p.row += count
			p.skipped += count
			if err := p.tick(1); err != nil {
				return 0, err
			}
			continue
		}
		for range count {
			text, long, err := vals.next()
			if err != nil {
				return 0, p.rowErrorf(p.row+1, "%v value: %v", enc, err)
			}
			p.row++
			if long {
				if !p.skipBad {
					return 0, p.rowErrorf(p.row, "%s longer than MaxDocumentBytes (%d)", p.field, MaxDocumentBytes)
				}
				p.skipped++
			} else {
				p.inDoc = true
				err := p.doc(p.row, text)
				p.inDoc = false
				if err != nil {
					return 0, err
				}
			}
			if err := p.tick(1); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

// tick counts n rows and checks the context every pqBatch rows.
func (p *pqReader) tick(n int) error {
	if p.batch += n; p.batch < pqBatch {
		return nil
	}
	p.batch = 0
	return p.ctx.Err()
}

// decompress decompresses src, which codec says is size bytes, into dst
// (reused if large enough) and returns it.
func (p *pqReader) decompress(codec format.CompressionCodec, src []byte, size int, dst []byte) ([]byte, error) {
	if size < 0 || size > pqMaxPageBytes {
		return nil, fmt.Errorf("%d bytes uncompressed", size)
	}
	// The block codecs decompress into a buffer of the page's size: a
	// size beyond what the codec can expand the page's bytes to is not
	// what the codec wrote (a SNAPPY copy of 3 bytes makes at most 64, a
	// ZSTD block of 4 bytes at most 128 KiB, an LZ4 byte at most 255).
	maxRatio := 0
	switch codec {
	case format.Snappy:
		maxRatio = 24
	case format.Zstd:
		maxRatio = 32 << 10
	case format.Lz4Raw:
		maxRatio = 256
	}
	if maxRatio > 0 && size > maxRatio*len(src)+1024 {
		return nil, fmt.Errorf("%d bytes of %v data cannot decompress to %d", len(src), codec, size)
	}
	var out []byte
	var err error
	switch codec {
	case format.Snappy:
		var n int
		if n, err = snappy.DecodedLen(src); err == nil && n != size {
			return nil, fmt.Errorf("SNAPPY data of %d bytes, the page says %d", n, size)
		}
		if err == nil {
			out, err = snappy.Decode(pqGrow(dst, size), src)
		}
	case format.Gzip:
		var zr *gzip.Reader
		if zr, err = gzip.NewReader(bytes.NewReader(src)); err == nil {
			out, err = pqReadExactly(zr, dst, size, len(src))
		}
	case format.Brotli:
		out, err = pqReadExactly(brotli.NewReader(bytes.NewReader(src)), dst, size, len(src))
	case format.Zstd:
		if p.zstd == nil {
			p.zstd, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecodeAllCapLimit(true),
				zstd.WithDecoderMaxMemory(pqMaxPageBytes))
			if err != nil {
				return nil, err
			}
		}
		out, err = p.zstd.DecodeAll(src, pqGrow(dst, size)[:0])
	case format.Lz4Raw:
		out = pqGrow(dst, size)
		var n int
		if n, err = lz4.UncompressBlock(src, out); err == nil {
			out = out[:n]
		}
	default:
		return nil, fmt.Errorf("compression codec %v is not supported", codec)
	}
	if err != nil {
		return nil, fmt.Errorf("%v: %v", codec, err)
	}
	if len(out) != size {
		return nil, fmt.Errorf("%v data decompress to %d bytes, the page says %d", codec, len(out), size)
	}
	return out, nil
}

// pqGrow returns b resized to n bytes, reallocated if too small.
func pqGrow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// pqReadExactly reads the size bytes r decompresses to into dst (reused
// if large enough), growing the buffer as the data comes from an initial
// guess from srcLen; more or fewer bytes is an error.
func pqReadExactly(r io.Reader, dst []byte, size, srcLen int) ([]byte, error) {
	buf := dst[:0]
	if cap(buf) < size {
		buf = make([]byte, 0, min(size, 4*srcLen+64<<10))
	}
	for len(buf) < size {
		if len(buf) == cap(buf) {
			b := make([]byte, len(buf), min(size, 2*cap(buf)))
			copy(b, buf)
			buf = b
		}
		n, err := r.Read(buf[len(buf):min(cap(buf), size)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if len(buf) < size {
		return nil, fmt.Errorf("%d bytes uncompressed, the page says %d", len(buf), size)
	}
	var one [1]byte
	if n, err := io.ReadFull(r, one[:]); n > 0 {
		return nil, fmt.Errorf("more than the page's %d bytes uncompressed", size)
	} else if err != io.EOF {
		return nil, err
	}
	return buf, nil
}

// pqChunk reads a column chunk: buf[lo:hi] holds its bytes from file
// offset pos; end is the chunk's end.
type pqChunk struct {
	r      io.ReaderAt
	buf    []byte
	lo, hi int
	pos    int64
	end    int64
}

// reset starts reading the chunk in file bytes [start, end).
func (c *pqChunk) reset(start, end int64) {
	c.lo, c.hi, c.pos, c.end = 0, 0, start, end
}

// fill makes buf[lo:hi] hold at least n bytes (n is at most end-pos).
func (c *pqChunk) fill(n int) error {
	if c.hi-c.lo >= n {
		return nil
	}
	have := copy(c.buf, c.buf[c.lo:c.hi])
	c.lo, c.hi = 0, have
	want := int(min(max(int64(n), pqReadAhead), c.end-c.pos))
	if cap(c.buf) < want {
		b := make([]byte, want)
		copy(b, c.buf[:have])
		c.buf = b
	}
	c.buf = c.buf[:cap(c.buf)]
	if err := pqReadAt(c.r, c.buf[have:want], c.pos+int64(have)); err != nil {
		return err
	}
	c.hi = want
	return nil
}

// pqLevels reads definition levels: RLE/bit-packed hybrid (rle),
// deprecated BIT_PACKED (packed), or none (all: every value defined).
type pqLevels struct {
	all    bool
	def    uint64 // the level of all
	rle    pqRLE
	packed []byte
	i      int64 // next level in packed
}

// run returns the next run of count equal levels.
func (l *pqLevels) run() (level uint64, count int64, err error) {
	switch {
	case l.all:
		return l.def, 1 << 62, nil
	case l.packed != nil:
		if l.i >= 8*int64(len(l.packed)) {
			return 0, 0, io.ErrUnexpectedEOF
		}
		// BIT_PACKED packs from the most significant bit.
		level = uint64(l.packed[l.i/8]>>(7-l.i%8)) & 1
		l.i++
		return level, 1, nil
	}
	return l.rle.run()
}

// pqRLE reads Parquet's RLE/bit-packed hybrid encoding of values of width
// bits, a run at a time.
type pqRLE struct {
	b     []byte // after the current run
	width uint
	left  int64  // values left in the current run
	rle   bool   // the current run repeats val; else it is bit-packed in packed
	val   uint64 //
	pack  []byte
	bit   uint64 // next bit in pack
}

// run returns the next count values equal to val: a whole RLE run, or one
// value of a bit-packed run.
func (d *pqRLE) run() (val uint64, count int64, err error) {
	for d.left == 0 {
		h, n := binary.Uvarint(d.b)
		if n <= 0 {
			return 0, 0, errors.New("truncated or invalid run header")
		}
		d.b = d.b[n:]
		if h&1 == 0 {
			w := int(d.width+7) / 8
			if len(d.b) < w {
				return 0, 0, errors.New("truncated run")
			}
			d.val = 0
			for i := range w {
				d.val |= uint64(d.b[i]) << (8 * i)
			}
			d.b = d.b[w:]
			d.rle, d.left = true, int64(min(h>>1, 1<<62))
			continue
		}
		values := min(h>>1, 1<<58) * 8
		if d.width == 0 {
			d.rle, d.val, d.left = true, 0, int64(values)
			continue
		}
		bytes := uint64(len(d.b))
		if need := values / 8 * uint64(d.width); need < bytes {
			bytes = need
		} else {
			values = bytes * 8 / uint64(d.width) // the last run may be cut short
		}
		d.pack, d.b = d.b[:bytes], d.b[bytes:]
		d.rle, d.bit, d.left = false, 0, int64(values)
	}
	if d.rle {
		count, d.left = d.left, 0
		return d.val, count, nil
	}
	val = pqBits(d.pack, d.bit, d.width)
	d.bit += uint64(d.width)
	d.left--
	return val, 1, nil
}

// pqBits returns the width bits of b from bit, least significant first
// (width at most 64; the caller checks they are in b).
func pqBits(b []byte, bit uint64, width uint) uint64 {
	var v uint64
	for got := uint(0); got < width; {
		shift := uint(bit & 7)
		take := min(8-shift, width-got)
		v |= uint64(b[bit>>3]>>shift) & (1<<take - 1) << got
		got += take
		bit += uint64(take)
	}
	return v
}

// pqDelta reads a DELTA_BINARY_PACKED stream of integers.
type pqDelta struct {
	b          []byte // after the current miniblock
	perMini    uint64 // values per miniblock
	miniBlocks uint64 // miniblocks per block
	total      uint64 // values in the stream
	left       uint64 // values not yet read
	last       int64
	widths     []byte // the current block's miniblock bit widths
	mb         uint64 // the next miniblock of the block
	minDelta   int64
	pack       []byte // the current miniblock
	width      uint
	bit        uint64
	mbLeft     uint64 // values left in the current miniblock
}

// init reads the stream's header from b.
func (d *pqDelta) init(b []byte) error {
	var h [3]uint64
	for i := range h {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return errors.New("truncated DELTA_BINARY_PACKED header")
		}
		h[i], b = v, b[n:]
	}
	first, n := binary.Varint(b)
	if n <= 0 {
		return errors.New("truncated DELTA_BINARY_PACKED header")
	}
	*d = pqDelta{b: b[n:], miniBlocks: h[1], total: h[2], left: h[2], last: first}
	block := h[0]
	if block == 0 || block%128 != 0 || block > 1<<32 || d.miniBlocks == 0 || block%d.miniBlocks != 0 || (block/d.miniBlocks)%32 != 0 {
		return fmt.Errorf("DELTA_BINARY_PACKED blocks of %d values in %d miniblocks", block, d.miniBlocks)
	}
	d.perMini = block / d.miniBlocks
	d.widths = d.b[:0]
	d.mb = d.miniBlocks
	return nil
}

// next returns the next integer.
func (d *pqDelta) next() (int64, error) {
	if d.left == 0 {
		return 0, errors.New("more values than the DELTA_BINARY_PACKED stream holds")
	}
	if d.left == d.total {
		d.left--
		return d.last, nil
	}
	for d.mbLeft == 0 {
		if err := d.miniBlock(); err != nil {
			return 0, err
		}
	}
	u := pqBits(d.pack, d.bit, d.width)
	d.bit += uint64(d.width)
	d.mbLeft--
	d.left--
	d.last += d.minDelta + int64(u)
	return d.last, nil
}

// miniBlock starts the next miniblock (and block, when one ends).
func (d *pqDelta) miniBlock() error {
	if d.mb == d.miniBlocks {
		md, n := binary.Varint(d.b)
		if n <= 0 {
			return errors.New("truncated DELTA_BINARY_PACKED block")
		}
		d.b = d.b[n:]
		if uint64(len(d.b)) < d.miniBlocks {
			return errors.New("truncated DELTA_BINARY_PACKED block")
		}
		d.minDelta, d.widths, d.b, d.mb = md, d.b[:d.miniBlocks], d.b[d.miniBlocks:], 0
	}
	w := uint64(d.widths[d.mb])
	d.mb++
	if w > 64 {
		return fmt.Errorf("DELTA_BINARY_PACKED bit width %d", w)
	}
	if w > 0 && d.perMini > uint64(len(d.b))*8/w {
		return errors.New("truncated DELTA_BINARY_PACKED miniblock")
	}
	size := d.perMini * w / 8
	d.pack, d.b = d.b[:size], d.b[size:]
	d.width, d.bit, d.mbLeft = uint(w), 0, min(d.perMini, d.left)
	return nil
}

// rest returns the bytes after the stream, skipping its values without
// decoding them (a miniblock at a time).
func (d pqDelta) rest() ([]byte, error) {
	if d.left == d.total && d.left > 0 {
		d.left--
	}
	for d.left > 0 {
		if d.mbLeft == 0 {
			if err := d.miniBlock(); err != nil {
				return nil, err
			}
		}
		k := min(d.mbLeft, d.left)
		d.mbLeft -= k
		d.left -= k
	}
	return d.b, nil
}

// pqValues decodes the non-null values of a data page.
type pqValues struct {
	enc     format.Encoding
	b       []byte // PLAIN values; DELTA value bytes
	dict    *pqDict
	idx     pqRLE // dictionary indexes
	started bool  // start has run
	idxVal  uint64
	idxLeft int64
	lens    pqDelta // DELTA lengths, DELTA_BYTE_ARRAY suffix lengths
	prefix  pqDelta // DELTA_BYTE_ARRAY prefix lengths
	prev    []byte  // DELTA_BYTE_ARRAY: the last value, cut at MaxDocumentBytes
	prevLen int64   // its length
}

// init starts decoding b, the values of a page in encoding enc.
func (v *pqValues) init(enc format.Encoding, b []byte, dict *pqDict) error {
	*v = pqValues{enc: enc, b: b, dict: dict}
	switch enc {
	case format.Plain, format.PlainDictionary, format.RLEDictionary, format.DeltaLengthByteArray, format.DeltaByteArray:
		return nil
	}
	return fmt.Errorf("encoding %v is not supported for strings", enc)
}

// start reads what precedes the values (a page without values may
// not have it).
func (v *pqValues) start() error {
	v.started = true
	switch v.enc {
	case format.PlainDictionary, format.RLEDictionary:
		if v.dict == nil {
			return fmt.Errorf("%v page without a dictionary page", v.enc)
		}
		if len(v.b) == 0 || v.b[0] > 32 {
			return errors.New("missing or invalid index bit width")
		}
		v.idx = pqRLE{b: v.b[1:], width: uint(v.b[0])}
	case format.DeltaLengthByteArray:
		if err := v.lens.init(v.b); err != nil {
			return err
		}
		var err error
		v.b, err = v.lens.rest()
		return err
	case format.DeltaByteArray:
		if err := v.prefix.init(v.b); err != nil {
			return err
		}
		rest, err := v.prefix.rest()
		if err != nil {
			return err
		}
		if err := v.lens.init(rest); err != nil {
			return err
		}
		if v.lens.total != v.prefix.total {
			return fmt.Errorf("%d prefix lengths, %d suffix lengths", v.prefix.total, v.lens.total)
		}
		v.b, err = v.lens.rest()
		return err
	}
	return nil
}

// next returns the next value, or long if it is longer than
// MaxDocumentBytes.
func (v *pqValues) next() (text []byte, long bool, err error) {
	if !v.started {
		if err := v.start(); err != nil {
			return nil, false, err
		}
	}
	switch v.enc {
	case format.Plain:
		if len(v.b) < 4 {
			return nil, false, io.ErrUnexpectedEOF
		}
		n := uint64(binary.LittleEndian.Uint32(v.b))
		if n > uint64(len(v.b)-4) {
			return nil, false, fmt.Errorf("%d bytes, %d left in the page", n, len(v.b)-4)
		}
		text, v.b = v.b[4:4+n], v.b[4+n:]
	case format.PlainDictionary, format.RLEDictionary:
		for v.idxLeft == 0 {
			if v.idxVal, v.idxLeft, err = v.idx.run(); err != nil {
				return nil, false, err
			}
		}
		v.idxLeft--
		var ok bool
		if text, ok = v.dict.value(v.idxVal); !ok {
			return nil, false, fmt.Errorf("index %d, the dictionary holds %d values", v.idxVal, len(v.dict.pos))
		}
	case format.DeltaLengthByteArray:
		n, err := v.lens.next()
		if err != nil {
			return nil, false, err
		}
		if n < 0 || n > int64(len(v.b)) {
			return nil, false, fmt.Errorf("length %d, %d bytes left in the page", n, len(v.b))
		}
		text, v.b = v.b[:n], v.b[n:]
	case format.DeltaByteArray:
		pre, err := v.prefix.next()
		if err != nil {
			return nil, false, err
		}
		suf, err := v.lens.next()
		if err != nil {
			return nil, false, err
		}
		if pre < 0 || pre > v.prevLen || suf < 0 || suf > int64(len(v.b)) {
			return nil, false, fmt.Errorf("prefix %d of the last value's %d bytes and suffix %d of %d bytes left", pre, v.prevLen, suf, len(v.b))
		}
		keep := min(pre, int64(len(v.prev)))
		add := min(suf, MaxDocumentBytes-keep)
		v.prev = append(v.prev[:keep], v.b[:add]...)
		v.b = v.b[suf:]
		v.prevLen = pre + suf
		text = v.prev
	}
	if int64(len(text)) > MaxDocumentBytes || (v.enc == format.DeltaByteArray && v.prevLen > MaxDocumentBytes) {
		return nil, true, nil
	}
	return text, false, nil
}

// pqErrShort means a thrift struct runs past the bytes at hand.
var pqErrShort = errors.New("truncated")

// pqThrift walks thrift compact-protocol data without decoding it.
type pqThrift struct {
	b      []byte
	off    int
	cost   int64 // bytes the lists so far would decode into
	budget int64
}

// pqScanThrift checks that b starts with a thrift struct that decodes into
// at most budget bytes of lists (estimated), and returns its length. It
// returns pqErrShort if the struct, or a list or string in it, runs
// past the end of b.
func pqScanThrift(b []byte, budget int64) (int, error) {
	s := pqThrift{b: b, budget: budget}
	if err := s.structure(0); err != nil {
		return 0, err
	}
	return s.off, nil
}

func (s *pqThrift) byte1() (byte, error) {
	if s.off >= len(s.b) {
		return 0, pqErrShort
	}
	s.off++
	return s.b[s.off-1], nil
}

func (s *pqThrift) uvarint() (uint64, error) {
	v, n := binary.Uvarint(s.b[s.off:])
	if n == 0 {
		return 0, pqErrShort
	}
	if n < 0 {
		return 0, errors.New("thrift varint overflows")
	}
	s.off += n
	return v, nil
}

func (s *pqThrift) skip(n uint64) error {
	if n > uint64(len(s.b)-s.off) {
		return pqErrShort
	}
	s.off += int(n)
	return nil
}

func (s *pqThrift) structure(depth int) error {
	if depth > pqThriftDepth {
		return errors.New("thrift structs nested too deep")
	}
	for {
		c, err := s.byte1()
		if err != nil || c == 0 {
			return err
		}
		if c>>4 == 0 { // field id as a varint, not a delta
			if _, err := s.uvarint(); err != nil {
				return err
			}
		}
		if err := s.value(c&0x0f, false, depth); err != nil {
			return err
		}
	}
}

// value skips a value of thrift compact type t; elem says it is a list or
// map element (where booleans take a byte).
func (s *pqThrift) value(t byte, elem bool, depth int) error {
	switch t {
	case 1, 2: // bool
		if elem {
			return s.skip(1)
		}
		return nil
	case 3: // i8
		return s.skip(1)
	case 4, 5, 6: // i16, i32, i64
		_, err := s.uvarint()
		return err
	case 7: // double
		return s.skip(8)
	case 8: // binary
		n, err := s.uvarint()
		if err != nil {
			return err
		}
		return s.skip(n)
	case 9, 10: // list, set
		c, err := s.byte1()
		if err != nil {
			return err
		}
		n := uint64(c >> 4)
		if n == 15 {
			if n, err = s.uvarint(); err != nil {
				return err
			}
		}
		return s.elems(n, []byte{c & 0x0f}, depth)
	case 11: // map
		n, err := s.uvarint()
		if err != nil || n == 0 {
			return err
		}
		c, err := s.byte1()
		if err != nil {
			return err
		}
		return s.elems(n, []byte{c >> 4, c & 0x0f}, depth)
	case 12: // struct
		return s.structure(depth + 1)
	case 13: // uuid
		return s.skip(16)
	}
	return fmt.Errorf("thrift type %d", t)
}

// elems skips n list elements (one type) or map entries (two).
func (s *pqThrift) elems(n uint64, types []byte, depth int) error {
	if depth >= pqThriftDepth {
		return errors.New("thrift lists nested too deep")
	}
	cost := int64(0)
	for _, t := range types {
		switch t {
		case 0, 14, 15:
			return fmt.Errorf("thrift element type %d", t)
		case 12:
			cost += pqStructCost
		case 8, 9, 10, 11:
			cost += 24
		default:
			cost += 8
		}
	}
	// Every element takes at least a byte.
	if n > uint64(len(s.b)-s.off)/uint64(len(types)) {
		return pqErrShort
	}
	if s.cost += int64(n) * cost; s.cost > s.budget {
		return fmt.Errorf("thrift lists would decode into more than %d bytes", s.budget)
	}
	for range n {
		for _, t := range types {
			if err := s.value(t, true, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}
