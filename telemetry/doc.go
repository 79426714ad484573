// Package telemetry defines what a volunteer reports to its run's bootstrap
// after every outer round, and the bounded wire encoding of that report on
// the run's telemetry protocol (/skein/<run>/telemetry/1).
//
// It owns the report's fields, the range of each, and their byte layout
// only: it must not open streams, store history or know about the status
// page (bootstrap does).
//
// # Values
//
// A report is the volunteer's own account; the bootstrap cannot verify it,
// but it shows it on a public web page, so neither MarshalBinary nor
// UnmarshalBinary accepts a value that makes no sense there (Report.Validate
// names the first one):
//   - TrainLoss and ValLoss are NaN (not measured) or finite and >= 0.
//   - TokensPerSec, ComputeSeconds and WallSeconds are finite and >= 0.
//   - Members is in [0, MaxMembers]; UnixMS is >= 0.
//   - EpochTrained is in [0, 1] (not NaN); without HasData, Epoch and
//     EpochTrained are 0 (+0, not -0).
//   - Device and Version are at most MaxString bytes of valid UTF-8, every
//     character printable (unicode.IsPrint: letters, marks, numbers,
//     punctuation, symbols and the ASCII space; no control, format or
//     bidirectional characters).
//
// # Wire format, version 1
//
// All integers are little-endian; floats are their IEEE 754 bits. A report
// is 88 to 228 bytes, and nothing else: a decoder refuses trailing bytes and
// refuses more than MaxReportSize bytes before reading any field.
//
//	offset size field
//	  0     1   version = 1
//	  1     8   Round (uint64)
//	  9     8   StateHash (uint64)
//	 17     1   flags: bit 0 = Adopted, bit 1 = HasData; other bits 0
//	 18     4   TrainLoss (float32)
//	 22     4   ValLoss (float32)
//	 26     8   Tokens (uint64)
//	 34     8   TokensPerSec (float64)
//	 42     8   BytesSent (uint64)
//	 50     8   BytesRecv (uint64)
//	 58     8   ComputeSeconds (float64)
//	 66     8   WallSeconds (float64)
//	 74     4   Members (uint32), <= MaxMembers
//	 78     8   UnixMS (int64), >= 0
//	 86     1   n = length of Device, <= MaxString
//	 87     n   Device, UTF-8
//	87+n    1   m = length of Version, <= MaxString
//	88+n    m   Version, UTF-8
//	88+n+m  8   Epoch (uint64), only when flags bit 1 (HasData) is set
//	96+n+m  4   EpochTrained (float32), in [0, 1], likewise
//
// A report without flags bit 1 (every report written before the data
// fields existed) ends with Version and decodes with HasData false.
//
// A NaN loss is written as the quiet NaN 0x7fc00000 and no other NaN bits
// are accepted, so every accepted encoding is the one MarshalBinary writes:
// decoding and encoding again gives the same bytes.
package telemetry
