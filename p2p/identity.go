package p2p

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/skein-ml/skein/internal/atomicfile"

	"github.com/libp2p/go-libp2p/core/crypto"
)

// IdentityFile is the name of the ed25519 key file inside a node's data directory.
const IdentityFile = "identity.key"

// maxKeyFile bounds how much of the key file is read.
const maxKeyFile = 4096

// LoadOrCreateIdentity returns the node's ed25519 key stored in dir, creating
// it (mode 0600, dir 0700) on first start. A key file that is a symbolic link
// or is readable by group or others is refused with ErrInsecureKey.
//
// The key is created exclusively: written whole to a temporary file and
// linked into place, which fails if the name exists (as O_CREAT|O_EXCL
// would, never following a link), so two processes starting on one data
// directory never overwrite each other's key; the one that loses the race
// loads the winner's key.
func LoadOrCreateIdentity(dir string) (crypto.PrivKey, error) {
	if dir == "" {
		return nil, errors.New("p2p: identity: empty data dir")
	}
	path := filepath.Join(dir, IdentityFile)
	k, err := loadIdentity(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	k, _, err = crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("p2p: identity: generate: %w", err)
	}
	b, err := crypto.MarshalPrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	// Atomic, exclusive and umask-proof: a crash never leaves half a key,
	// and a racing creator's key is never replaced.
	switch err := atomicfile.WriteNewFile(path, b, 0o600); {
	case errors.Is(err, fs.ErrExist):
		return loadIdentity(path)
	case err != nil:
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	return k, nil
}

// loadIdentity reads the key at path, refusing a symbolic link and a file
// readable by group or others. A missing file is an error wrapping
// fs.ErrNotExist.
func loadIdentity(path string) (crypto.PrivKey, error) {
	if st, err := os.Lstat(path); err == nil && st.Mode()&fs.ModeSymlink != 0 {
		return nil, fmt.Errorf("%w: %s is a symbolic link; put the key file itself there (or move the link away to create a new identity)",
			ErrInsecureKey, path)
	}
	// O_NOFOLLOW: a link swapped in since the Lstat is refused too.
	f, err := os.OpenFile(path, os.O_RDONLY|oNoFollow, 0)
	if err != nil {
		if isLinkRefused(err) {
			return nil, fmt.Errorf("%w: %s is a symbolic link; put the key file itself there", ErrInsecureKey, path)
		}
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("p2p: identity: %s is not a regular file (%v)", path, st.Mode().Type())
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %#o, readable by group or others; run `chmod 600 %s`", ErrInsecureKey, path, perm, path)
	}
	if st.Size() > maxKeyFile {
		return nil, fmt.Errorf("p2p: identity: %s is %d bytes, more than %d", path, st.Size(), maxKeyFile)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	k, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("p2p: identity: decode %s: %w", path, err)
	}
	if k.Type() != crypto.Ed25519 {
		return nil, fmt.Errorf("p2p: identity: %s holds a %v key, want Ed25519", path, k.Type())
	}
	return k, nil
}
