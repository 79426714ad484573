package compression

import "errors"

// Sentinel errors. Every error returned by this package wraps one of these
// with %w and adds context (which chunk, which field, which value), so callers
// test with errors.Is and log the message.
var (
	// ErrConfig reports a Config field out of range (other than BlockSize).
	ErrConfig = errors.New("compression: invalid config")
	// ErrBlockSize reports a block size outside [MinBlockSize, MaxBlockSize]
	// or not a multiple of 8, in a Config or in a frame header.
	ErrBlockSize = errors.New("compression: bad block size")
	// ErrCodec reports an unknown codec id.
	ErrCodec = errors.New("compression: unknown codec")
	// ErrBadMagic reports a frame or state that does not start with the expected magic bytes.
	ErrBadMagic = errors.New("compression: bad magic")
	// ErrVersion reports a wire format version this package does not read.
	ErrVersion = errors.New("compression: unsupported version")
	// ErrTruncated reports input that ended before the frame was complete.
	ErrTruncated = errors.New("compression: truncated input")
	// ErrChecksum reports a header or chunk whose checksum does not match.
	ErrChecksum = errors.New("compression: checksum mismatch")
	// ErrTooLarge reports a declared size beyond the configured limit; it is
	// returned before anything of that size is allocated.
	ErrTooLarge = errors.New("compression: declared size too large")
	// ErrCorrupt reports a frame whose checksum is valid but whose content is
	// inconsistent (lengths, flags, chunk order, scales).
	ErrCorrupt = errors.New("compression: corrupt frame")
	// ErrNonFinite reports a NaN or ±Inf in a tensor to encode or in decoded
	// values. Policy: such tensors are rejected, never silently clamped.
	ErrNonFinite = errors.New("compression: non-finite value")
	// ErrSize reports a tensor whose length does not match what the caller or
	// the state expects.
	ErrSize = errors.New("compression: size mismatch")
)
