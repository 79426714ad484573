package p2p

import (
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/memberlist"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

func TestIdentityPersistsAndIsPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	k1, err := LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, IdentityFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, err %v; want 0600", st.Mode().Perm(), err)
	}
	k2, err := LoadOrCreateIdentity(dir)
	if err != nil || !k1.Equals(k2) {
		t.Fatalf("second load: equal=%v err=%v", k1.Equals(k2), err)
	}
	if err := os.Chmod(filepath.Join(dir, IdentityFile), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = LoadOrCreateIdentity(dir)
	if !errors.Is(err, ErrInsecureKey) || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("world-readable key: err %v, want ErrInsecureKey saying how to fix it", err)
	}
}

// A key path that is a symbolic link is refused, whether it points at a
// key or nowhere (a dangling link is not created through).
func TestIdentityRefusesSymlink(t *testing.T) {
	elsewhere := t.TempDir()
	if _, err := LoadOrCreateIdentity(elsewhere); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"to a key": filepath.Join(elsewhere, IdentityFile),
		"dangling": filepath.Join(elsewhere, "absent.key"),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.Symlink(target, filepath.Join(dir, IdentityFile)); err != nil {
				t.Fatal(err)
			}
			if _, err := LoadOrCreateIdentity(dir); !errors.Is(err, ErrInsecureKey) {
				t.Fatalf("err %v, want ErrInsecureKey", err)
			}
		})
	}
	if _, err := os.Lstat(filepath.Join(elsewhere, "absent.key")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a key was created through the dangling link: %v", err)
	}
}

// Processes starting together on one data directory end up with one key:
// a second create never replaces the first (exclusive creation).
func TestIdentityRacingCreatesAgree(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	const n = 8
	keys := make([]crypto.PrivKey, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { keys[i], errs[i] = LoadOrCreateIdentity(dir) })
	}
	wg.Wait()
	onDisk, err := LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if errs[i] != nil || !keys[i].Equals(onDisk) {
			t.Fatalf("creator %d: err %v, same key as on disk %v", i, errs[i], errs[i] == nil && keys[i].Equals(onDisk))
		}
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 1 {
		t.Fatalf("data directory holds %v, want only the key", left)
	}
}

// TestDelegateRefusesOtherRun: even a peer speaking this run's protocols is
// refused by memberlist if its metadata names another run.
func TestDelegateRefusesOtherRun(t *testing.T) {
	ev := newEvents("run-a", "", nil)
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := peer.IDFromPrivateKey(key)
	id := pid.String()
	sign := func(m Meta) []byte {
		fields, _ := m.MarshalBinary()
		b, err := signMeta(key, 1, nil, 0, fields)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	good, bad := sign(Meta{RunID: "run-a"}), sign(Meta{RunID: "run-b"})
	if err := ev.NotifyAlive(&memberlist.Node{Name: id, Meta: good}); err != nil {
		t.Fatalf("same run refused: %v", err)
	}
	if err := ev.NotifyAlive(&memberlist.Node{Name: id, Meta: bad}); !errors.Is(err, ErrWrongRun) {
		t.Fatalf("other run: %v, want ErrWrongRun", err)
	}
	if err := ev.NotifyMerge([]*memberlist.Node{{Name: id, Meta: good}, {Name: id, Meta: bad}}); !errors.Is(err, ErrWrongRun) {
		t.Fatalf("merge with other run: %v, want ErrWrongRun", err)
	}
	if err := ev.NotifyAlive(&memberlist.Node{Name: id, Meta: []byte{1}}); !errors.Is(err, ErrBadMeta) {
		t.Fatalf("garbage meta: %v, want ErrBadMeta", err)
	}
}

func TestConfigValidateNamesValue(t *testing.T) {
	c := DefaultNodeConfig("run")
	c.Timing.ProbeTimeout = 10 * c.Timing.ProbeInterval
	if err := c.Validate(); err == nil {
		t.Fatal("bad timing accepted")
	}
	c = DefaultNodeConfig("bad run!")
	if err := c.Validate(); err == nil {
		t.Fatal("bad run id accepted")
	}
	c = DefaultNodeConfig("run")
	c.Bootstrap = []string{"/ip4/1.2.3.4/udp/1/quic-v1"}
	if err := c.Validate(); err == nil {
		t.Fatal("bootstrap without /p2p accepted")
	}
	c = DefaultNodeConfig("run")
	c.ForgetAfter = 0
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "ForgetAfter") {
		t.Fatalf("ForgetAfter 0: err %v, want one naming ForgetAfter", err)
	}
}
