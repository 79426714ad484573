package p2p

import (
	"crypto/rand"
	"errors"
	"fmt"
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
// it (mode 0600, dir 0700) on first start. A key file readable by group or
// others is refused with ErrInsecureKey.
func LoadOrCreateIdentity(dir string) (crypto.PrivKey, error) {
	if dir == "" {
		return nil, errors.New("p2p: identity: empty data dir")
	}
	path := filepath.Join(dir, IdentityFile)
	st, err := os.Stat(path)
	switch {
	case err == nil:
		if st.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("%w: %s has mode %v, want 0600", ErrInsecureKey, path, st.Mode().Perm())
		}
		if st.Size() > maxKeyFile {
			return nil, fmt.Errorf("p2p: identity: %s is %d bytes, more than %d", path, st.Size(), maxKeyFile)
		}
		b, err := os.ReadFile(path)
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
	case errors.Is(err, fs.ErrNotExist):
	default:
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("p2p: identity: generate: %w", err)
	}
	b, err := crypto.MarshalPrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	// Atomic and umask-proof: a crash never leaves half a key.
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	return k, nil
}
