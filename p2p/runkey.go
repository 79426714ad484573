package p2p

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/skein-ml/skein/internal/atomicfile"
)

// A run key file holds the run key's private half as a PEM "PRIVATE KEY"
// block (PKCS #8, the form `openssl pkey` reads), mode 0600. It signs the
// join tokens of a closed run (admission.go) and belongs with the run's
// operator; a bootstrap may hold it (NodeConfig.RunKey) to issue its own.

const (
	runKeyPEM     = "PRIVATE KEY"
	maxRunKeyFile = 4096
)

// CreateRunKey makes a new run key and writes it to path, which must not
// exist (the file is created exclusively, whole or not at all, mode 0600).
// It returns the key.
func CreateRunKey(path string) (ed25519.PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("p2p: run key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("p2p: run key: %w", err)
	}
	b := pem.EncodeToMemory(&pem.Block{Type: runKeyPEM, Bytes: der})
	if err := atomicfile.WriteNewFile(path, b, 0o600); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("p2p: run key: %s exists; a run has one key (remove the file to replace it, and every token with it)", path)
		}
		return nil, fmt.Errorf("p2p: run key: %w", err)
	}
	return priv, nil
}

// LoadRunKey reads a run key file, refusing a symbolic link and a file
// readable by group or others (ErrInsecureKey), as identity files are.
func LoadRunKey(path string) (ed25519.PrivateKey, error) {
	lst, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("p2p: run key: %w", err)
	}
	if lst.Mode()&fs.ModeSymlink != 0 {
		return nil, fmt.Errorf("%w: run key %s is a symbolic link; put the key file itself there", ErrInsecureKey, path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("p2p: run key: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("p2p: run key: %w", err)
	}
	// The file opened is the one checked: not a link swapped in since.
	if !os.SameFile(lst, st) || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: run key %s changed while opened, or is not a regular file", ErrInsecureKey, path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%w: run key %s has mode %#o, readable by group or others; run `chmod 600 %s`", ErrInsecureKey, path, perm, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxRunKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("p2p: run key: %w", err)
	}
	if len(b) > maxRunKeyFile {
		return nil, fmt.Errorf("p2p: run key: %s is more than %d bytes", path, maxRunKeyFile)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != runKeyPEM {
		return nil, fmt.Errorf("p2p: run key: %s holds no PEM %q block", path, runKeyPEM)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("p2p: run key: %s: %w", path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("p2p: run key: %s holds a %T, not an ed25519 key", path, k)
	}
	return priv, nil
}
