package replica

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/skein-ml/skein/transport"
)

// An anchor is a round certificate countersigned by the run's bootstrap:
// the bootstrap follows the chain itself (from the first certificate it
// took, which a strict majority of the volunteers it saw live signed) and
// signs
//
//	anchorContext | u16 len(run) | run | u64 round | u64 state hash | group digest (32)
//
// for the latest certificate it trusts. A newcomer, which has no earlier
// group to check a chain against, checks the announcers' chain from the
// anchor instead (Book.AdoptFrom): sybils it sees must then fool the
// bootstrap's view too, not only its own.
//
// On the wire (MarshalBinary):
//
//	0   4   magic "SKAN"
//	4   1   version (1)
//	5   64  the bootstrap's signature
//	69      the certificate (Certificate.MarshalBinary)
const (
	anchorContext = "skein/replica/anchor/1"
	anchorMagic   = "SKAN"
	anchorVersion = 1
)

// Size bounds of the encodings, for the frames that carry them.
const (
	MaxCertBytes   = 4 + 1 + 2 + maxRun + 8 + 8 + 2 + MaxGroup*(1+MaxIDLen+1+sigLen)
	MaxAnchorBytes = 4 + 1 + sigLen + MaxCertBytes
)

// Anchor is a certificate and the bootstrap's countersignature of it.
type Anchor struct {
	Cert *Certificate
	Sig  []byte
}

// Countersign signs c (verified by the caller) with the bootstrap's key.
func Countersign(c *Certificate, sign func([]byte) ([]byte, error)) (*Anchor, error) {
	sig, err := sign(signedBytes(anchorContext, c.Run, c.Round, c.Hash, c.Group))
	if err != nil {
		return nil, err
	}
	return &Anchor{Cert: c, Sig: sig}, nil
}

// Verify checks that a's certificate is a valid certificate of run and
// that bootstrap countersigned it (for this run, round, state and group).
func (a *Anchor) Verify(run string, signer transport.Signer, bootstrap transport.PeerID) error {
	if err := a.Cert.Verify(run, signer); err != nil {
		return err
	}
	c := a.Cert
	if !signer.Verify(bootstrap, signedBytes(anchorContext, c.Run, c.Round, c.Hash, c.Group), a.Sig) {
		return fmt.Errorf("%w: %s's countersignature of round %d", ErrBadSignature, bootstrap, c.Round)
	}
	return nil
}

// MarshalBinary encodes an anchor with a well-formed certificate.
func (a *Anchor) MarshalBinary() ([]byte, error) {
	if len(a.Sig) != sigLen {
		return nil, fmt.Errorf("%w: a %d-byte countersignature", ErrBadCert, len(a.Sig))
	}
	c, err := a.Cert.MarshalBinary()
	if err != nil {
		return nil, err
	}
	b := append([]byte(anchorMagic), anchorVersion)
	return append(append(b, a.Sig...), c...), nil
}

// UnmarshalBinary decodes an anchor (Certificate.UnmarshalBinary's bounds);
// the signatures are not checked (Verify).
func (a *Anchor) UnmarshalBinary(b []byte) error {
	r := reader{b: b}
	if m := r.take(len(anchorMagic)); !bytes.Equal(m, []byte(anchorMagic)) {
		return fmt.Errorf("%w: bad anchor magic", ErrBadCert)
	}
	if v := r.take(1); v != nil && v[0] != anchorVersion {
		return fmt.Errorf("%w: anchor version %d, want %d", ErrBadCert, v[0], anchorVersion)
	}
	sig := slices.Clone(r.take(sigLen))
	if r.err != nil {
		return r.err
	}
	c := new(Certificate)
	if err := c.UnmarshalBinary(r.b); err != nil {
		return err
	}
	*a = Anchor{Cert: c, Sig: sig}
	return nil
}

// VouchedBy is the rule for a certificate taken without an earlier group
// (a newcomer, a restart without a saved certificate, the bootstrap's
// first): a strict majority of live, the other volunteers the taker sees
// live, signed it (c verified). No single member and no fixed number of
// them decides: sybils must outnumber the live honest volunteers in the
// taker's view.
func VouchedBy(live []transport.PeerID, c *Certificate) error {
	n := 0
	for _, id := range live {
		if i, ok := slices.BinarySearch(c.Group, id); ok && c.Sigs[i] != nil {
			n++
		}
	}
	if 2*n <= len(live) {
		return fmt.Errorf("%w: %d of the %d volunteers seen live signed round %d", ErrMinority, n, len(live), c.Round)
	}
	return nil
}
