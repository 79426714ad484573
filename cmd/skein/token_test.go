package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/p2p"
)

// runApp runs skein with args and returns its stdout.
func runApp(t *testing.T, args ...string) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	err = newApp().Run(append([]string{"skein"}, args...))
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	return string(out), err
}

// keygen, issue and show: the key file is private and never overwritten,
// its public half goes in a manifest that parses, and a token issued with
// it verifies against that manifest's key.
func TestTokenCommands(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "run.key")
	out, err := runApp(t, "token", "keygen", "--out", keyFile)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(keyFile)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, mode %v", err, st.Mode())
	}
	m, err := manifest.Parse([]byte("[admission]\nmode = \"closed\"\n" + out))
	if err != nil {
		t.Fatalf("keygen's line %q in a manifest: %v", out, err)
	}
	before, _ := os.ReadFile(keyFile)
	if _, err := runApp(t, "token", "keygen", "--out", keyFile); err == nil {
		t.Error("keygen overwrote a key")
	}
	if after, _ := os.ReadFile(keyFile); string(after) != string(before) {
		t.Error("key file changed")
	}

	key, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	id, _ := peer.IDFromPrivateKey(key)
	tokFile := filepath.Join(dir, "node.token")
	out, err = runApp(t, "token", "issue", "--key", keyFile, "--peer", id.String(), "--run", "skein-demo", "--role", "volunteer",
		"--ttl", "1h", "--out", tokFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{strings.TrimSpace(out), "@" + tokFile} {
		b, err := readToken(v)
		if err != nil {
			t.Fatalf("readToken(%q): %v", v, err)
		}
		tok, err := p2p.VerifyToken(m.Admission.RunPublicKey(), b, id, "skein-demo", time.Now())
		if err != nil || tok.Role != p2p.RoleVolunteer || time.Until(tok.Expires) > time.Hour {
			t.Fatalf("issued token: %+v, %v", tok, err)
		}
	}
	out, err = runApp(t, "token", "show", "--run-key", m.Admission.RunKey, "@"+tokFile)
	if err != nil || !strings.Contains(out, id.String()) || !strings.Contains(out, "valid now") {
		t.Fatalf("show: %q, %v", out, err)
	}

	for _, args := range [][]string{
		{"token", "issue", "--key", keyFile, "--peer", "nobody", "--run", "r"},
		{"token", "issue", "--key", keyFile, "--peer", id.String(), "--run", "r", "--role", "admin"},
		{"token", "issue", "--key", keyFile, "--peer", id.String(), "--run", "r", "--ttl", "-1h"},
		{"token", "issue", "--key", keyFile, "--peer", id.String(), "--run", "a/b"},
		{"token", "issue", "--key", filepath.Join(dir, "missing"), "--peer", id.String(), "--run", "r"},
		{"token", "show", "not-a-token"},
	} {
		if _, err := runApp(t, args...); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
	// A key readable by others is refused.
	os.Chmod(keyFile, 0o644)
	if _, err := runApp(t, "token", "issue", "--key", keyFile, "--peer", id.String(), "--run", "r"); !errors.Is(err, p2p.ErrInsecureKey) {
		t.Errorf("key readable by others: %v", err)
	}
}

func TestTokenHint(t *testing.T) {
	key, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	id, _ := peer.IDFromPrivateKey(key)
	err := tokenHint(&p2p.NotAdmittedError{Self: id, RunID: "r", Err: p2p.ErrTokenExpired}, "volunteer")
	if !errors.Is(err, p2p.ErrTokenExpired) || !strings.Contains(err.Error(), "skein token issue --key RUN-KEY --peer "+id.String()+" --run r --role volunteer") {
		t.Errorf("hint: %v", err)
	}
	full := &p2p.NotAdmittedError{Self: id, RunID: "r", Err: p2p.ErrRunFull}
	if err := tokenHint(full, "volunteer"); err != error(full) {
		t.Errorf("a full run got a token hint: %v", err)
	}
	if tokenHint(nil, "volunteer") != nil {
		t.Error("nil")
	}
}

// TestClosedRunJoin runs the real binary: a closed run's bootstrap holding
// the run key; a volunteer without a token stops at once and says which
// peer ID to ask a token for; with `skein token issue`'s token for that
// peer ID it joins and trains a round.
func TestClosedRunJoin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs three processes")
	}
	keyFile := filepath.Join(t.TempDir(), "run.key")
	key, err := p2p.CreateRunKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	closed := smallRun + "[admission]\nmode = \"closed\"\nrun_key = \"" + p2p.EncodeRunKey(key.Public().(ed25519.PublicKey)) + "\"\n"
	net := []string{"--listen", "/ip4/127.0.0.1/udp/0/quic-v1", "--timing", "lan"}
	run := startBootstrap(t, closed, append([]string{"--run-key", keyFile}, net...))
	dataDir := filepath.Join(run.dir, "v")
	join := func(extra ...string) (string, error) {
		args := append([]string{"--log-level", "warn", "node", "join", "--bootstrap", run.addr, "--data-dir", dataDir,
			"--rounds", "1", "--threads", "1"}, append(net, extra...)...)
		out, err := exec.CommandContext(run.ctx, run.bin, args...).CombinedOutput()
		return string(out), err
	}
	began := time.Now()
	out, err := join()
	m := regexp.MustCompile(`--peer (12D3Koo\w+) --run skein-demo --role volunteer`).FindStringSubmatch(out)
	if err == nil || m == nil || !strings.Contains(out, "--token TOKEN") {
		t.Fatalf("volunteer without a token (err %v):\n%s", err, out)
	}
	if took := time.Since(began); took > 30*time.Second {
		t.Errorf("refusal took %v", took)
	}
	t.Logf("refused in %v:\n%s", time.Since(began).Round(time.Millisecond), out)
	tok, err := exec.CommandContext(run.ctx, run.bin, "token", "issue", "--key", keyFile, "--peer", m[1], "--run", "skein-demo").Output()
	if err != nil {
		t.Fatal(err)
	}
	out, err = join("--token", strings.TrimSpace(string(tok)))
	if err != nil || !regexp.MustCompile(`(?m)^round 1: `).MatchString(out) {
		t.Fatalf("volunteer with a token (err %v):\n%s", err, out)
	}
}
