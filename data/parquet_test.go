package data

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/snappy"
	"github.com/klauspost/compress/zstd"
	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress"
	"github.com/parquet-go/parquet-go/encoding"
	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"
)

// pqRead reads every document of the Parquet file b's column field.
func pqRead(b []byte, field string, skipBad bool) (docs []string, rows []int64, skipped int64, err error) {
	skipped, err = ParquetDocuments(context.Background(), bytes.NewReader(b), int64(len(b)), "test.parquet", field, skipBad,
		func(row int64, text []byte) error {
			docs = append(docs, string(text))
			rows = append(rows, row)
			return nil
		})
	return docs, rows, skipped, err
}

// pqCase is how pqWrite writes a file.
type pqCase struct {
	enc      encoding.Encoding
	codec    compress.Codec
	version  int // data page version
	optional bool
}

func (c pqCase) String() string {
	o := "required"
	if c.optional {
		o = "optional"
	}
	return fmt.Sprintf("%v/%v/v%d/%s", c.enc, c.codec, c.version, o)
}

// pqWrite writes texts (nil is a null) as the column "text" of a Parquet
// file with parquet-go, in small pages and row groups of 7 rows.
func pqWrite(t testing.TB, c pqCase, texts []*string) []byte {
	t.Helper()
	node := parquet.Compressed(parquet.Encoded(parquet.String(), c.enc), c.codec)
	def := 0
	if c.optional {
		node, def = parquet.Optional(node), 1
	}
	schema := parquet.NewSchema("doc", parquet.Group{"text": node})
	var buf bytes.Buffer
	w := parquet.NewWriter(&buf, schema, parquet.PageBufferSize(64), parquet.MaxRowsPerRowGroup(7), parquet.DataPageVersion(c.version))
	for _, s := range texts {
		v := parquet.NullValue().Level(0, 0, 0)
		if s != nil {
			v = parquet.ByteArrayValue([]byte(*s)).Level(0, def, 0)
		}
		if _, err := w.WriteRows([]parquet.Row{{v}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// pqFooter decodes the footer of the Parquet file b.
func pqFooter(t testing.TB, b []byte) *format.FileMetaData {
	t.Helper()
	n := int(binary.LittleEndian.Uint32(b[len(b)-8:]))
	var md format.FileMetaData
	if err := thrift.Unmarshal(new(thrift.CompactProtocol), b[len(b)-8-n:len(b)-8], &md); err != nil {
		t.Fatal(err)
	}
	return &md
}

// pqTexts are the documents the round-trip tests write: the empty string,
// multi-byte UTF-8, repeats (for dictionaries), lengths that cross DELTA
// blocks, and a 1 MiB document.
func pqTexts() []string {
	r := rand.New(rand.NewPCG(1, 2))
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte('a' + r.IntN(26))
	}
	texts := []string{"", "hello", "naïve café — 日本語 🎉", "\x00\xff not UTF-8 \x80", "hello", string(big), ""}
	for i := range 150 {
		texts = append(texts, strings.Repeat("ab", r.IntN(40))+fmt.Sprint(i%9))
	}
	return append(texts, "the end")
}

func pqPointers(texts []string) []*string {
	p := make([]*string, len(texts))
	for i := range texts {
		p[i] = &texts[i]
	}
	return p
}

var (
	pqEncodings = []encoding.Encoding{&parquet.Plain, &parquet.RLEDictionary, &parquet.PlainDictionary, &parquet.DeltaLengthByteArray, &parquet.DeltaByteArray}
	pqCodecs    = []compress.Codec{&parquet.Uncompressed, &parquet.Snappy, &parquet.Gzip, &parquet.Brotli, &parquet.Zstd, &parquet.Lz4Raw}
)

// TestParquetDocuments round-trips documents through every encoding,
// codec, page version and repetition parquet-go writes, in several row
// groups of several pages. Each encoding and codec pair has the 1 MiB
// document in one of its four files.
func TestParquetDocuments(t *testing.T) {
	all := pqTexts()
	small := slices.DeleteFunc(slices.Clone(all), func(s string) bool { return len(s) > 1<<10 })
	for i, enc := range pqEncodings {
		for j, codec := range pqCodecs {
			for k, version := range []int{1, 2} {
				for l, optional := range []bool{false, true} {
					c := pqCase{enc, codec, version, optional}
					texts := small
					if (i+j)%4 == 2*k+l {
						texts = all
					}
					t.Run(c.String(), func(t *testing.T) {
						b := pqWrite(t, c, pqPointers(texts))
						md := pqFooter(t, b)
						if len(md.RowGroups) < 2 {
							t.Fatalf("%d row groups", len(md.RowGroups))
						}
						want := enc.Encoding()
						if want == format.PlainDictionary {
							want = format.RLEDictionary // parquet-go writes PLAIN_DICTIONARY as RLE_DICTIONARY
						}
						cm := md.RowGroups[0].Columns[0].MetaData
						if !slices.Contains(cm.Encoding, want) || cm.Codec != codec.CompressionCodec() {
							t.Fatalf("column chunk encodings %v codec %v, want %v %v", cm.Encoding, cm.Codec, want, codec.CompressionCodec())
						}
						docs, rows, skipped, err := pqRead(b, "text", false)
						if err != nil {
							t.Fatal(err)
						}
						if skipped != 0 || !slices.Equal(docs, texts) {
							t.Fatalf("skipped %d, %d docs, want %d", skipped, len(docs), len(texts))
						}
						for i, row := range rows {
							if row != int64(i+1) {
								t.Fatalf("doc %d is row %d", i, row)
							}
						}
					})
				}
			}
		}
	}
}

// TestParquetFields reads a column among others, and refuses columns that
// are missing or not strings.
func TestParquetFields(t *testing.T) {
	type inner struct {
		A string `parquet:"a"`
	}
	type row struct {
		ID      int64    `parquet:"id"`
		Nested  inner    `parquet:"nested"`
		Content string   `parquet:"content,dict,zstd"`
		Tags    []string `parquet:"tags,list"`
		Fixed   [4]byte  `parquet:"fixed"`
		Text    string   `parquet:"text,snappy"`
	}
	var rows []row
	for i := range 40 {
		rows = append(rows, row{ID: int64(i), Nested: inner{"x"}, Content: fmt.Sprintf("content %d", i%5), Tags: []string{"t"}, Text: fmt.Sprint("text ", i)})
	}
	var buf bytes.Buffer
	w := parquet.NewGenericWriter[row](&buf, parquet.MaxRowsPerRowGroup(16), parquet.PageBufferSize(128))
	if _, err := w.Write(rows); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	for _, field := range []string{"content", "text"} {
		docs, _, _, err := pqRead(b, field, false)
		if err != nil {
			t.Fatal(field, err)
		}
		for i, d := range docs {
			want := rows[i].Content
			if field == "text" {
				want = rows[i].Text
			}
			if d != want {
				t.Fatalf("%s row %d: %q, want %q", field, i+1, d, want)
			}
		}
		if len(docs) != len(rows) {
			t.Fatalf("%s: %d docs, want %d", field, len(docs), len(rows))
		}
	}
	for field, msg := range map[string]string{
		"missing": `no column "missing" (columns: id, nested, content, tags, fixed, text)`,
		"Text":    `no column "Text"`,
		"id":      `column "id" is INT64, not a string`,
		"nested":  `column "nested" is a group`,
		"tags":    `column "tags" is a group`,
		"fixed":   `column "fixed" is FIXED_LEN_BYTE_ARRAY`,
		"a":       `no column "a"`,
	} {
		_, _, _, err := pqRead(b, field, false)
		if !errors.Is(err, ErrDataFormat) || !strings.Contains(err.Error(), "data: test.parquet: "+msg) {
			t.Errorf("field %q: %v, want ErrDataFormat %q", field, err, msg)
		}
	}
}

// TestParquetBadRows: a null row is an error naming it, or skipped.
func TestParquetBadRows(t *testing.T) {
	texts := pqPointers([]string{"a", "b", "", "d", "e", "f", "g", "h", "i", "j", "k", "l"})
	texts[2], texts[9], texts[10] = nil, nil, nil
	for _, enc := range []encoding.Encoding{&parquet.Plain, &parquet.RLEDictionary, &parquet.DeltaByteArray} {
		for _, version := range []int{1, 2} {
			c := pqCase{enc, &parquet.Snappy, version, true}
			b := pqWrite(t, c, texts)
			_, _, _, err := pqRead(b, "text", false)
			if !errors.Is(err, ErrDataFormat) || !strings.HasPrefix(err.Error(), "data: test.parquet row 3: null text") {
				t.Errorf("%v: %v, want null row 3", c, err)
			}
			docs, rows, skipped, err := pqRead(b, "text", true)
			if err != nil || skipped != 3 {
				t.Fatalf("%v: skipped %d: %v", c, skipped, err)
			}
			if want := []string{"a", "b", "d", "e", "f", "g", "h", "i", "l"}; !slices.Equal(docs, want) {
				t.Errorf("%v: %q, want %q", c, docs, want)
			}
			if want := []int64{1, 2, 4, 5, 6, 7, 8, 9, 12}; !slices.Equal(rows, want) {
				t.Errorf("%v: rows %v, want %v", c, rows, want)
			}
		}
	}
}

// TestParquetLongDocument: a document longer than MaxDocumentBytes is a
// bad row (the page is ZSTD: its 256 MiB are a few KiB).
func TestParquetLongDocument(t *testing.T) {
	if testing.Short() {
		t.Skip("256 MiB")
	}
	var plain []byte
	for _, n := range []int{3, MaxDocumentBytes + 1, 2} {
		plain = binary.LittleEndian.AppendUint32(plain, uint32(n))
		plain = append(plain, bytes.Repeat([]byte{'x'}, n)...)
	}
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	page := pqPage{h: format.PageHeader{Type: format.DataPage, UncompressedPageSize: int32(len(plain)),
		DataPageHeader: thrift.New(format.DataPageHeader{NumValues: 3, Encoding: format.Plain, DefinitionLevelEncoding: format.RLE})},
		body: enc.EncodeAll(plain, nil)}
	plain = nil
	b := pqBuild(pqFile{codec: format.Zstd, rows: 3, pages: []pqPage{page}})
	if _, _, _, err := pqRead(b, "text", false); !errors.Is(err, ErrDataFormat) || !strings.HasPrefix(err.Error(), "data: test.parquet row 2: text longer than MaxDocumentBytes") {
		t.Fatalf("%v, want row 2 too long", err)
	}
	docs, rows, skipped, err := pqRead(b, "text", true)
	if err != nil || skipped != 1 || !slices.Equal(docs, []string{"xxx", "xx"}) || !slices.Equal(rows, []int64{1, 3}) {
		t.Fatalf("rows %v skipped %d: %v", rows, skipped, err)
	}
}

// TestParquetCorrupt: truncated, overwritten and random files are format
// errors naming the file, and never panic.
func TestParquetCorrupt(t *testing.T) {
	texts := pqPointers(pqTexts()[:5])
	texts[1] = nil
	files := map[string][]byte{}
	for _, c := range []pqCase{
		{&parquet.RLEDictionary, &parquet.Snappy, 1, true},
		{&parquet.Plain, &parquet.Lz4Raw, 2, false},
		{&parquet.DeltaByteArray, &parquet.Zstd, 2, true},
		{&parquet.DeltaLengthByteArray, &parquet.Gzip, 1, false},
		{&parquet.Plain, &parquet.Brotli, 1, true},
	} {
		files[c.String()] = pqWrite(t, c, texts)
	}
	check := func(what string, b []byte, size int64) {
		t.Helper()
		for _, skipBad := range []bool{false, true} {
			_, err := ParquetDocuments(context.Background(), bytes.NewReader(b), size, "bad.parquet", "text", skipBad,
				func(int64, []byte) error { return nil })
			if err != nil && (!errors.Is(err, ErrDataFormat) || !strings.HasPrefix(err.Error(), "data: bad.parquet")) {
				t.Errorf("%s: %v, want nil or ErrDataFormat naming the file", what, err)
			}
		}
	}
	for name, b := range files {
		for _, n := range []int{0, 1, 4, 11, 12, 13, len(b) / 3, len(b) / 2, len(b) - 9, len(b) - 8, len(b) - 1} {
			for _, size := range []int64{int64(n), int64(len(b))} {
				_, err := ParquetDocuments(context.Background(), bytes.NewReader(b[:n]), size, "bad.parquet", "text", true,
					func(int64, []byte) error { return nil })
				if !errors.Is(err, ErrDataFormat) || !strings.HasPrefix(err.Error(), "data: bad.parquet") {
					t.Errorf("%s cut at %d (size %d): %v, want ErrDataFormat naming the file", name, n, size, err)
				}
			}
		}
		// Every byte overwritten, one at a time.
		for i := range b {
			c := bytes.Clone(b)
			c[i] ^= 0xff
			check(fmt.Sprintf("%s byte %d", name, i), c, int64(len(c)))
			c[i] = 0
			check(fmt.Sprintf("%s byte %d zero", name, i), c, int64(len(c)))
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		b := make([]byte, r.IntN(300))
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		if i%2 == 0 && len(b) >= 12 {
			copy(b, "PAR1")
			copy(b[len(b)-4:], "PAR1")
			binary.LittleEndian.PutUint32(b[len(b)-8:], uint32(r.IntN(len(b)-11)))
		}
		_, _, _, err := pqRead(b, "text", true)
		if !errors.Is(err, ErrDataFormat) {
			t.Fatalf("random file %d: %v, want ErrDataFormat", i, err)
		}
	}
}

// TestParquetStop: doc's error and a cancelled context stop the read and
// are returned as they are; doc's panics are not the file's.
func TestParquetStop(t *testing.T) {
	texts := make([]string, 5000)
	for i := range texts {
		texts[i] = fmt.Sprint(i)
	}
	b := pqWrite(t, pqCase{&parquet.Plain, &parquet.Uncompressed, 2, false}, pqPointers(texts))
	stop := errors.New("stop")
	calls := 0
	_, err := ParquetDocuments(context.Background(), bytes.NewReader(b), int64(len(b)), "f", "text", false, func(row int64, _ []byte) error {
		calls++
		if row == 3 {
			return stop
		}
		return nil
	})
	if err != stop || calls != 3 {
		t.Errorf("doc error: %v after %d calls, want stop after 3", err, calls)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls = 0
	if _, err := ParquetDocuments(ctx, bytes.NewReader(b), int64(len(b)), "f", "text", false, func(int64, []byte) error { calls++; return nil }); err != context.Canceled || calls != 0 {
		t.Errorf("cancelled: %v after %d calls, want context.Canceled", err, calls)
	}
	ctx, cancel = context.WithCancel(context.Background())
	calls = 0
	_, err = ParquetDocuments(ctx, bytes.NewReader(b), int64(len(b)), "f", "text", false, func(int64, []byte) error {
		if calls++; calls == 10 {
			cancel()
		}
		return nil
	})
	if err != context.Canceled || calls > 10+pqBatch {
		t.Errorf("cancelled at row 10: %v after %d calls, want context.Canceled", err, calls)
	}

	defer func() {
		if v := recover(); v != "doc panics" {
			t.Errorf("recovered %v, want doc's panic", v)
		}
	}()
	ParquetDocuments(context.Background(), bytes.NewReader(b), int64(len(b)), "f", "text", false, func(int64, []byte) error { panic("doc panics") })
	t.Error("doc's panic was swallowed")
}

// pqFailReader fails reads past off.
type pqFailReader struct {
	*bytes.Reader
	off int64
}

var errPQDisk = errors.New("disk error")

func (r pqFailReader) ReadAt(b []byte, off int64) (int, error) {
	if off+int64(len(b)) > r.off {
		return 0, errPQDisk
	}
	return r.Reader.ReadAt(b, off)
}

// TestParquetReadError: the reader's errors are returned naming the file,
// and are not format errors.
func TestParquetReadError(t *testing.T) {
	b := pqWrite(t, pqCase{&parquet.Plain, &parquet.Snappy, 2, false}, pqPointers([]string{"a", "b"}))
	for _, off := range []int64{0, 4, int64(len(b)) - 8, int64(len(b)) - 100} {
		_, err := ParquetDocuments(context.Background(), pqFailReader{bytes.NewReader(b), off}, int64(len(b)), "f", "text", false,
			func(int64, []byte) error { return nil })
		if !errors.Is(err, errPQDisk) || errors.Is(err, ErrDataFormat) || !strings.HasPrefix(err.Error(), "data: f: ") {
			t.Errorf("reads fail past %d: %v, want the disk error", off, err)
		}
	}
}

// pqPage is a page for pqBuild.
type pqPage struct {
	h    format.PageHeader
	raw  []byte // the header, if not h
	body []byte
}

// pqFile is a file for pqBuild: one column "text".
type pqFile struct {
	codec    format.CompressionCodec
	optional bool
	rows     int64
	pages    []pqPage
}

// pqBuild writes f, filling in the page sizes left zero.
func pqBuild(f pqFile) []byte {
	b := []byte("PAR1")
	for _, p := range f.pages {
		h := p.raw
		if h == nil {
			if p.h.CompressedPageSize == 0 {
				p.h.CompressedPageSize = int32(len(p.body))
			}
			if p.h.UncompressedPageSize == 0 {
				p.h.UncompressedPageSize = int32(len(p.body))
			}
			var err error
			if h, err = thrift.Marshal(new(thrift.CompactProtocol), &p.h); err != nil {
				panic(err)
			}
		}
		b = append(append(b, h...), p.body...)
	}
	rep := format.Required
	if f.optional {
		rep = format.Optional
	}
	md := format.FileMetaData{
		Version: 1,
		Schema: []format.SchemaElement{
			{Name: "schema", NumChildren: thrift.New[int32](1)},
			{Name: "text", Type: thrift.New(format.ByteArray), RepetitionType: thrift.New(rep)},
		},
		NumRows: f.rows,
		RowGroups: []format.RowGroup{{NumRows: f.rows, TotalByteSize: int64(len(b) - 4), Columns: []format.ColumnChunk{{
			FileOffset: 4,
			MetaData: format.ColumnMetaData{
				Type: format.ByteArray, Encoding: []format.Encoding{format.Plain, format.RLE}, PathInSchema: []string{"text"},
				Codec: f.codec, NumValues: f.rows, TotalUncompressedSize: int64(len(b) - 4), TotalCompressedSize: int64(len(b) - 4),
				DataPageOffset: 4,
			},
		}}}},
	}
	footer, err := thrift.Marshal(new(thrift.CompactProtocol), &md)
	if err != nil {
		panic(err)
	}
	b = append(b, footer...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(footer)))
	return append(b, "PAR1"...)
}

// pqV1 is the header of a v1 data page of n values.
func pqV1(n int32, enc format.Encoding) format.PageHeader {
	return format.PageHeader{Type: format.DataPage,
		DataPageHeader: thrift.New(format.DataPageHeader{NumValues: n, Encoding: enc, DefinitionLevelEncoding: format.RLE})}
}

// pqPlain is PLAIN byte arrays.
func pqPlain(texts ...string) []byte {
	var b []byte
	for _, s := range texts {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return b
}

// TestParquetHandBuilt reads files parquet-go does not write: deprecated
// BIT_PACKED levels, a dictionary page the column chunk does not point
// to, index pages.
func TestParquetHandBuilt(t *testing.T) {
	dict := pqPage{h: format.PageHeader{Type: format.DictionaryPage,
		DictionaryPageHeader: thrift.New(format.DictionaryPageHeader{NumValues: 3, Encoding: format.PlainDictionary})},
		body: pqPlain("zero", "one", "two")}
	for name, tc := range map[string]struct {
		f    pqFile
		want []string
	}{
		"bit-packed levels": {pqFile{optional: true, rows: 10, pages: []pqPage{{
			h: format.PageHeader{Type: format.DataPage, DataPageHeader: thrift.New(format.DataPageHeader{NumValues: 10, Encoding: format.Plain, DefinitionLevelEncoding: format.BitPacked})},
			// levels 1011 1111 11: row 2 is null.
			body: append([]byte{0b10111111, 0b11000000}, pqPlain("a", "c", "d", "e", "f", "g", "h", "i", "j")...)}}},
			[]string{"a", "c", "d", "e", "f", "g", "h", "i", "j"}},
		"plain dictionary, rle levels, index page": {pqFile{optional: true, rows: 6, pages: []pqPage{dict,
			{h: format.PageHeader{Type: format.IndexPage}},
			{h: pqV1(6, format.PlainDictionary),
				// levels: a bit-packed run of 8 (1,1,1,0,1,1 and padding);
				// indexes of width 2: an RLE run of two 1s, bit-packed 2,0,1.
				body: []byte{2, 0, 0, 0, 3, 0b11110111, 2, 4, 1, 3, 0b00010010, 0}}}},
			[]string{"one", "one", "two", "zero", "one"}},
		"empty pages": {pqFile{rows: 2, pages: []pqPage{{h: pqV1(0, format.Plain)}, {h: pqV1(2, format.Plain), body: pqPlain("x", "")}, {h: pqV1(0, format.DeltaByteArray)}}},
			[]string{"x", ""}},
	} {
		docs, _, skipped, err := pqRead(pqBuild(tc.f), "text", true)
		if err != nil || !slices.Equal(docs, tc.want) {
			t.Errorf("%s: %q (skipped %d): %v, want %q", name, docs, skipped, err, tc.want)
		}
	}
}

// TestParquetHostile: sizes and counts that the file's bytes cannot back
// are format errors, found before anything is allocated for them.
func TestParquetHostile(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(make([]byte, 4<<20))
	zw.Close()
	zs, _ := zstd.NewWriter(nil)
	big := zs.EncodeAll(make([]byte, 1<<20), nil)
	// A ZSTD frame that says it holds 1 GiB: magic, 8-byte content size,
	// 1 KiB window, 1 GiB, an empty last raw block.
	fcs := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xc0, 0, 0, 0, 0, 0x40, 0, 0, 0, 0, 1, 0, 0}
	// A page header with a list of 2^31-1 i32 in field 100.
	listBomb, _ := thrift.Marshal(new(thrift.CompactProtocol), &format.PageHeader{Type: format.DataPage, UncompressedPageSize: 8, CompressedPageSize: 8})
	listBomb = append(listBomb[:len(listBomb)-1], 0x09, 100, 0, 0xf5, 0xff, 0xff, 0xff, 0xff, 0x07, 0)
	huge := func(h format.PageHeader, size int32) format.PageHeader { h.UncompressedPageSize = size; return h }
	for name, tc := range map[string]struct {
		f    pqFile
		want string
	}{
		"lz4 garbage": {pqFile{codec: format.Lz4Raw, rows: 1, pages: []pqPage{{h: huge(pqV1(1, format.Plain), 100), body: []byte{0xf0, 0, 0x10, 0}}}},
			"LZ4_RAW"},
		"snappy 1 GiB": {pqFile{codec: format.Snappy, rows: 1, pages: []pqPage{{h: huge(pqV1(1, format.Plain), 1<<30), body: snappy.Encode(nil, pqPlain("x"))}}},
			"cannot decompress"},
		"snappy says 1 GiB": {pqFile{codec: format.Snappy, rows: 1, pages: []pqPage{{h: huge(pqV1(1, format.Plain), 5), body: []byte{0x80, 0x80, 0x80, 0x80, 4, 0}}}},
			"SNAPPY"},
		"zstd 1 GiB": {pqFile{codec: format.Zstd, rows: 1, pages: []pqPage{{h: huge(pqV1(1, format.Plain), 1<<30), body: fcs}}},
			"cannot decompress"},
		"zstd frame says 1 GiB": {pqFile{codec: format.Zstd, rows: 1, pages: []pqPage{{h: huge(pqV1(1, format.Plain), 100), body: fcs}}},
			"ZSTD"},
		"zstd more than the page": {pqFile{codec: format.Zstd, rows: 1, pages: []pqPage{{h: huge(pqV1(1, format.Plain), 1000), body: big}}},
			"ZSTD"},
		"gzip bomb": {pqFile{codec: format.Gzip, rows: 1, pages: []pqPage{{h: huge(pqV1(1, format.Plain), 1000), body: gz.Bytes()}}},
			"more than the page's 1000 bytes"},
		"page over 1 GiB": {pqFile{codec: format.Gzip, rows: 1, pages: []pqPage{{h: huge(pqV1(1, format.Plain), 1<<30+1), body: gz.Bytes()}}},
			"at most 1073741824"},
		"page past the chunk": {pqFile{rows: 1, pages: []pqPage{{h: format.PageHeader{Type: format.DataPage, CompressedPageSize: 1 << 30, UncompressedPageSize: 1 << 30, DataPageHeader: pqV1(1, format.Plain).DataPageHeader}}}},
			"left in the column chunk"},
		"header list bomb": {pqFile{rows: 1, pages: []pqPage{{raw: listBomb, body: make([]byte, 8)}}},
			"page header"},
		"index past the dictionary": {pqFile{rows: 2, pages: []pqPage{
			{h: format.PageHeader{Type: format.DictionaryPage, DictionaryPageHeader: thrift.New(format.DictionaryPageHeader{NumValues: 1, Encoding: format.Plain})}, body: pqPlain("a")},
			{h: pqV1(2, format.RLEDictionary), body: []byte{1, 3, 0b10}}}},
			"row 2: RLE_DICTIONARY value: index 1, the dictionary holds 1 values"},
		"dictionary counts": {pqFile{rows: 1, pages: []pqPage{
			{h: format.PageHeader{Type: format.DictionaryPage, DictionaryPageHeader: thrift.New(format.DictionaryPageHeader{NumValues: 1 << 30, Encoding: format.Plain})}, body: pqPlain("a")}}},
			"1073741824 values in 5 bytes"},
		"no dictionary": {pqFile{rows: 1, pages: []pqPage{{h: pqV1(1, format.RLEDictionary), body: []byte{1, 2, 0}}}},
			"without a dictionary page"},
		"delta counts": {pqFile{rows: 1, pages: []pqPage{{h: pqV1(1, format.DeltaLengthByteArray),
			// 2^62 lengths in blocks of 128 values, one miniblock.
			body: []byte{0x80, 1, 1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40, 0}}}},
			"truncated DELTA_BINARY_PACKED block"},
		"delta block size": {pqFile{rows: 1, pages: []pqPage{{h: pqV1(1, format.DeltaByteArray), body: []byte{0xff, 0xff, 0xff, 0xff, 0x0f, 1, 1, 0}}}},
			"DELTA_BINARY_PACKED blocks of"},
		"delta prefix past the value": {pqFile{rows: 1, pages: []pqPage{{h: pqV1(1, format.DeltaByteArray), body: []byte{0x80, 1, 4, 1, 2, 0x80, 1, 4, 1, 0}}}},
			"prefix 1 of the last value's 0 bytes"},
		"more values than rows": {pqFile{rows: 1, pages: []pqPage{{h: pqV1(1, format.Plain), body: pqPlain("a")}, {h: pqV1(1, format.Plain), body: pqPlain("b")}}},
			"a page of 1 values, 0 rows left"},
		"fewer values than rows": {pqFile{rows: 3, pages: []pqPage{{h: pqV1(1, format.Plain), body: pqPlain("a")}}},
			"pages hold 1 values, the row group 3 rows"},
		"plain past the page": {pqFile{rows: 1, pages: []pqPage{{h: pqV1(1, format.Plain), body: []byte{0xff, 0xff, 0xff, 0x7f, 'a'}}}},
			"row 1: PLAIN value: 2147483647 bytes, 1 left in the page"},
		"levels past the page": {pqFile{optional: true, rows: 1, pages: []pqPage{{h: pqV1(1, format.Plain), body: []byte{0xff, 0xff, 0xff, 0x7f, 'a'}}}},
			"2147483647 bytes of definition levels"},
		"level 2": {pqFile{optional: true, rows: 1, pages: []pqPage{{h: pqV1(1, format.Plain), body: []byte{2, 0, 0, 0, 2, 2}}}},
			"row 1: definition level 2"},
		"unsupported codec": {pqFile{codec: format.Lz4, rows: 1, pages: []pqPage{{h: pqV1(1, format.Plain), body: pqPlain("a")}}},
			"compression codec LZ4 is not supported"},
		"unsupported encoding": {pqFile{rows: 1, pages: []pqPage{{h: pqV1(1, format.ByteStreamSplit), body: pqPlain("a")}}},
			"encoding BYTE_STREAM_SPLIT is not supported"},
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, _, _, err := pqRead(pqBuild(tc.f), "text", true)
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrDataFormat) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrDataFormat %q", name, err, tc.want)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > 8<<20 {
			t.Errorf("%s: allocated %d bytes", name, n)
		}
	}

	// 2^31-1 null rows in a 6-byte RLE run are skipped at once.
	b := pqBuild(pqFile{optional: true, rows: 1<<31 - 1, pages: []pqPage{{h: pqV1(1<<31-1, format.Plain), body: []byte{6, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0x0f, 0}}}})
	if docs, _, skipped, err := pqRead(b, "text", true); err != nil || skipped != 1<<31-1 || len(docs) != 0 {
		t.Errorf("a run of 2^31-1 nulls: skipped %d, %d docs: %v", skipped, len(docs), err)
	}

	// A footer whose row group list says 2^31-1 elements.
	b = pqBuild(pqFile{rows: 1, pages: []pqPage{{h: pqV1(1, format.Plain), body: pqPlain("a")}}})
	n := int(binary.LittleEndian.Uint32(b[len(b)-8:]))
	footer := b[len(b)-8-n : len(b)-8]
	// Field 4 (row groups) follows field 3: a list of one struct.
	i := bytes.Index(footer, []byte{0x19, 0x1c})
	if i < 0 {
		t.Fatalf("footer % x: no row group list", footer)
	}
	bomb := append(slices.Clone(b[:len(b)-8-n]), footer[:i+1]...)
	// A list of structs of 2^31-1 elements.
	bomb = append(bomb, 0xfc, 0xff, 0xff, 0xff, 0xff, 0x07)
	bomb = append(bomb, footer[i+2:]...)
	if got, want := len(bomb)-(len(b)-8-n), n+5; got != want {
		t.Fatalf("footer of %d bytes, want %d", got, want)
	}
	bomb = binary.LittleEndian.AppendUint32(bomb, uint32(n+5))
	bomb = append(bomb, "PAR1"...)
	if _, _, _, err := pqRead(bomb, "text", true); !errors.Is(err, ErrDataFormat) || !strings.Contains(err.Error(), "footer") {
		t.Errorf("footer list bomb: %v", err)
	}
}

// TestParquetThriftCost: pqStructCost bounds every struct parquet-go
// decodes a footer or page header list element into.
func TestParquetThriftCost(t *testing.T) {
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type)
	walk = func(t2 reflect.Type) {
		if seen[t2] {
			return
		}
		seen[t2] = true
		switch t2.Kind() {
		case reflect.Struct:
			for i := range t2.NumField() {
				walk(t2.Field(i).Type)
			}
		case reflect.Slice:
			limit := uintptr(24)
			if t2.Elem().Kind() == reflect.Struct {
				limit = pqStructCost
			}
			if t2.Elem().Size() > limit {
				t.Errorf("%v: elements of %d bytes, more than %d", t2, t2.Elem().Size(), limit)
			}
			walk(t2.Elem())
		case reflect.Pointer, reflect.Array:
			walk(t2.Elem())
		}
	}
	walk(reflect.TypeFor[format.FileMetaData]())
	walk(reflect.TypeFor[format.PageHeader]())
}

// TestParquetDelta checks the DELTA_BINARY_PACKED and RLE decoders against
// parquet-go's encoders.
func TestParquetDelta(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 1, 2, 31, 32, 33, 127, 128, 129, 1000} {
		for _, spread := range []int32{0, 1, 1000, 1 << 30} {
			vals := make([]int32, n)
			for i := range vals {
				vals[i] = r.Int32N(spread+1) - spread/2
				if spread == 1<<30 && i%7 == 0 {
					vals[i] = int32(r.Uint32())
				}
			}
			b, err := (&parquet.DeltaBinaryPacked).EncodeInt32(nil, vals)
			if err != nil {
				t.Fatal(err)
			}
			b = append(b, "tail"...)
			var d pqDelta
			if err := d.init(b); err != nil {
				t.Fatal(n, spread, err)
			}
			if rest, err := d.rest(); err != nil || string(rest) != "tail" {
				t.Fatalf("n %d spread %d: rest %q: %v", n, spread, rest, err)
			}
			for i, want := range vals {
				got, err := d.next()
				if err != nil || int32(got) != want {
					t.Fatalf("n %d spread %d value %d: %d, %v, want %d", n, spread, i, got, err, want)
				}
			}
			if _, err := d.next(); err == nil {
				t.Fatalf("n %d: a value past the end", n)
			}

			for _, width := range []int{1, 3, 8, 17, 32} {
				if n == 0 {
					break
				}
				idx := make([]int32, n)
				for i := range idx {
					if r.IntN(3) == 0 && i > 0 {
						idx[i] = idx[i-1]
					} else {
						idx[i] = int32(r.Uint32() >> (32 - width))
					}
				}
				b, err := (&parquet.RLEDictionary).EncodeInt32(nil, idx)
				if err != nil {
					t.Fatal(err)
				}
				// RLE_DICTIONARY starts with the bit width it chose.
				rle := pqRLE{b: b[1:], width: uint(b[0])}
				for i := 0; i < n; {
					v, c, err := rle.run()
					if err != nil {
						t.Fatalf("width %d: value %d: %v", width, i, err)
					}
					for ; c > 0 && i < n; c-- {
						if int32(v) != idx[i] {
							t.Fatalf("width %d value %d: %d, want %d", width, i, v, idx[i])
						}
						i++
					}
				}
			}
		}
	}
}

// pqNoCRC rewrites the Parquet file b without page checksums (and without
// its page index), so that the fuzzer's changes to pages reach the
// decoders.
func pqNoCRC(t testing.TB, b []byte) []byte {
	t.Helper()
	md := pqFooter(t, b)
	out := []byte("PAR1")
	for i := range md.RowGroups {
		rg := &md.RowGroups[i]
		rg.FileOffset = int64(len(out))
		for j := range rg.Columns {
			c := &rg.Columns[j]
			cm := &c.MetaData
			start := cm.DataPageOffset
			if d := cm.DictionaryPageOffset; d > 0 && d < start {
				start = d
			}
			c.FileOffset, cm.DataPageOffset, cm.DictionaryPageOffset = int64(len(out)), 0, 0
			c.OffsetIndexOffset, c.OffsetIndexLength, c.ColumnIndexOffset, c.ColumnIndexLength = 0, 0, 0, 0
			for off := start; off < start+cm.TotalCompressedSize; {
				n, err := pqScanThrift(b[off:], 1<<20)
				if err != nil {
					t.Fatal(err)
				}
				var h format.PageHeader
				if err := thrift.Unmarshal(new(thrift.CompactProtocol), b[off:off+int64(n)], &h); err != nil {
					t.Fatal(err)
				}
				h.CRC = 0
				if h.Type == format.DictionaryPage {
					cm.DictionaryPageOffset = int64(len(out))
				} else if cm.DataPageOffset == 0 {
					cm.DataPageOffset = int64(len(out))
				}
				hb, err := thrift.Marshal(new(thrift.CompactProtocol), &h)
				if err != nil {
					t.Fatal(err)
				}
				off += int64(n)
				out = append(append(out, hb...), b[off:off+int64(h.CompressedPageSize)]...)
				off += int64(h.CompressedPageSize)
			}
			cm.TotalCompressedSize = int64(len(out)) - c.FileOffset
		}
	}
	footer, err := thrift.Marshal(new(thrift.CompactProtocol), md)
	if err != nil {
		t.Fatal(err)
	}
	out = binary.LittleEndian.AppendUint32(append(out, footer...), uint32(len(footer)))
	return append(out, "PAR1"...)
}

// pqSeeds are small files of every encoding and codec for the fuzzer,
// without page checksums.
func pqSeeds(t testing.TB) [][]byte {
	texts := pqPointers([]string{"a", "bb", "", "a", "ccc", "dd", "a", "e", "ffff"})
	var seeds [][]byte
	for i, enc := range pqEncodings {
		for j, codec := range pqCodecs {
			c := pqCase{enc, codec, 1 + (i+j)%2, (i+j)%3 != 0}
			if c.optional {
				texts[4] = nil
			} else {
				texts[4] = texts[1]
			}
			seeds = append(seeds, pqNoCRC(t, pqWrite(t, c, texts)))
		}
	}
	return seeds
}

// TestParquetSeeds: the fuzzer's seeds read as the files they are made
// from.
func TestParquetSeeds(t *testing.T) {
	want := []string{"a", "bb", "", "a", "dd", "a", "e", "ffff"}
	for i, b := range pqSeeds(t) {
		if md := pqFooter(t, b); md.RowGroups[0].Columns[0].MetaData.DataPageOffset == 0 {
			t.Fatalf("seed %d: no data page", i)
		}
		docs, _, _, err := pqRead(b, "text", true)
		if err != nil {
			t.Fatalf("seed %d: %v", i, err)
		}
		if len(docs) == 9 {
			docs = slices.Delete(docs, 4, 5)
		}
		if !slices.Equal(docs, want) {
			t.Fatalf("seed %d: %q, want %q", i, docs, want)
		}
	}
}

// FuzzParquetDocuments: no file makes ParquetDocuments panic, or fail with
// anything but ErrDataFormat.
func FuzzParquetDocuments(f *testing.F) {
	for i, b := range pqSeeds(f) {
		f.Add(b, i%2 == 0)
	}
	f.Add(pqWrite(f, pqCase{&parquet.RLEDictionary, &parquet.Snappy, 1, true}, pqPointers([]string{"a", "b", "a"})), true)
	f.Add(pqBuild(pqFile{optional: true, rows: 6, pages: []pqPage{
		{h: format.PageHeader{Type: format.DictionaryPage, DictionaryPageHeader: thrift.New(format.DictionaryPageHeader{NumValues: 3, Encoding: format.PlainDictionary})}, body: pqPlain("zero", "one", "two")},
		{h: pqV1(6, format.PlainDictionary), body: []byte{2, 0, 0, 0, 3, 0b11110111, 2, 4, 1, 3, 0b00010010, 0}}}}), false)
	f.Add([]byte("PAR1\x00\x00\x00\x00PAR1"), false)
	stop := errors.New("stop")
	f.Fuzz(func(t *testing.T, b []byte, skipBad bool) {
		last, docs := int64(0), 0
		_, err := ParquetDocuments(context.Background(), bytes.NewReader(b), int64(len(b)), "fuzz", "text", skipBad, func(row int64, text []byte) error {
			if row <= last || len(text) > MaxDocumentBytes {
				t.Fatalf("row %d after %d, %d bytes", row, last, len(text))
			}
			last = row
			if docs++; docs == 1<<16 {
				return stop
			}
			return nil
		})
		if err != nil && err != stop && !errors.Is(err, ErrDataFormat) {
			t.Fatal(err)
		}
	})
}
