package p2p

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

func newRunKey(t testing.TB) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

func newPeer(t testing.TB) (peer.ID, crypto.PrivKey) {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return id, key
}

func issue(t testing.TB, key ed25519.PrivateKey, tok Token) []byte {
	t.Helper()
	b, err := IssueToken(key, tok)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTokenVerify(t *testing.T) {
	pub, priv := newRunKey(t)
	_, otherPriv := newRunKey(t)
	id, _ := newPeer(t)
	other, _ := newPeer(t)
	now := time.Unix(1_800_000_000, 0)
	good := Token{Peer: id, RunID: "run-1", Role: RoleVolunteer, Expires: now.Add(time.Hour)}
	valid := issue(t, priv, good)

	flip := func(b []byte, i int) []byte {
		c := bytes.Clone(b)
		c[i] ^= 1
		return c
	}
	cases := []struct {
		name  string
		token []byte
		peer  peer.ID
		run   string
		now   time.Time
		want  error
	}{
		{"valid", valid, id, "run-1", now, nil},
		{"valid until the last second", valid, id, "run-1", now.Add(time.Hour - time.Second), nil},
		{"expired", valid, id, "run-1", now.Add(time.Hour), ErrTokenExpired},
		{"expired long ago", issue(t, priv, Token{Peer: id, RunID: "run-1", Expires: time.Unix(1, 0)}), id, "run-1", now, ErrTokenExpired},
		{"signed by another key", issue(t, otherPriv, good), id, "run-1", now, ErrTokenForged},
		{"signature altered", flip(valid, len(valid)-1), id, "run-1", now, ErrTokenForged},
		{"role altered", flip(valid, 1), id, "run-1", now, ErrTokenForged},
		{"expiry altered", flip(valid, 9), id, "run-1", now, ErrTokenForged},
		{"run altered", flip(valid, 11), id, "run-1", now, ErrTokenForged},
		{"wrong peer", valid, other, "run-1", now, ErrTokenWrongPeer},
		{"wrong run", valid, id, "run-2", now, ErrTokenWrongRun},
		{"missing", nil, id, "run-1", now, ErrTokenMissing},
		{"truncated by one", valid[:len(valid)-1], id, "run-1", now, ErrTokenMalformed},
		{"truncated to the header", valid[:12], id, "run-1", now, ErrTokenMalformed},
		{"one byte", valid[:1], id, "run-1", now, ErrTokenMalformed},
		{"trailing byte", append(bytes.Clone(valid), 0), id, "run-1", now, ErrTokenMalformed},
		{"version 2", flip(valid, 0)[:], id, "run-1", now, ErrTokenMalformed}, // 1^1 = 0
		{"role 3", func() []byte { c := bytes.Clone(valid); c[1] = 3; return c }(), id, "run-1", now, ErrTokenMalformed},
		{"run length 0", func() []byte { c := bytes.Clone(valid); c[10] = 0; return c }(), id, "run-1", now, ErrTokenMalformed},
		{"run length past the end", func() []byte { c := bytes.Clone(valid); c[10] = 64; return c }(), id, "run-1", now, ErrTokenMalformed},
		{"oversized", make([]byte, MaxTokenLen+1), id, "run-1", now, ErrTokenMalformed},
	}
	for _, c := range cases {
		got, err := VerifyToken(pub, c.token, c.peer, c.run, c.now)
		if c.want == nil {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			} else if got != good {
				t.Errorf("%s: got %+v, want %+v", c.name, got, good)
			}
			continue
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
		if !IsTokenError(err) {
			t.Errorf("%s: IsTokenError(%v) = false", c.name, err)
		}
	}
	// A forged token that names the right peer and run is still forged.
	if _, err := VerifyToken(pub, issue(t, otherPriv, good), id, "run-1", now); !strings.Contains(err.Error(), "not signed by the run key") {
		t.Errorf("forged: %v", err)
	}
}

func TestTokenLayout(t *testing.T) {
	_, priv := newRunKey(t)
	id, _ := newPeer(t)
	tok := Token{Peer: id, RunID: "abc", Role: RoleBootstrap, Expires: time.Unix(0x0102030405, 0)}
	b := issue(t, priv, tok)
	pid := []byte(id)
	want := append([]byte{1, 1, 0, 0, 0, 0x01, 0x02, 0x03, 0x04, 0x05, 3, 'a', 'b', 'c', byte(len(pid))}, pid...)
	if !bytes.HasPrefix(b, want) || len(b) != len(want)+64 || len(b) != 76+3+len(pid) {
		t.Fatalf("token %x\nwant %x + 64-byte signature", b, want)
	}
	if !ed25519.Verify(priv.Public().(ed25519.PublicKey), append([]byte(TokenContext), want...), b[len(want):]) {
		t.Error("signature is not over the context and the fields")
	}
	// Text form, both alphabets, padded or not.
	s := EncodeToken(b)
	for _, in := range []string{s, " " + s + "\n", strings.NewReplacer("-", "+", "_", "/").Replace(s) + "=="} {
		got, err := DecodeToken(in)
		if err != nil || !bytes.Equal(got, b) {
			t.Errorf("DecodeToken(%q) = %x, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "!!", s[:len(s)-4], strings.Repeat("A", 400)} {
		if _, err := DecodeToken(in); !errors.Is(err, ErrTokenMalformed) {
			t.Errorf("DecodeToken(%q): %v, want ErrTokenMalformed", in, err)
		}
	}
	// The longest token fits in metadata with the longest fields.
	long := Token{Peer: peer.ID(append([]byte{0x00, 62}, bytes.Repeat([]byte{7}, 62)...)), RunID: strings.Repeat("r", MaxRunIDLen),
		Expires: time.Unix(MaxTokenExpiry, 0)}
	lb := issue(t, priv, long)
	if len(lb) != MaxTokenLen {
		t.Fatalf("longest token %d bytes, MaxTokenLen %d", len(lb), MaxTokenLen)
	}
	m := Meta{RunID: long.RunID, Device: strings.Repeat("d", MaxDeviceLen), Version: strings.Repeat("v", MaxVersionLen), Token: string(lb)}
	fields, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	key, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	signed, err := signMeta(key, 1, net.ParseIP("2001:db8::1"), 4001, fields)
	if err != nil {
		t.Fatalf("longest metadata with a token: %v", err)
	}
	t.Logf("longest metadata with a token: %d bytes, %d signed, limit %d", len(fields), len(signed), MetaLimit)
	var back Meta
	if err := back.UnmarshalBinary(fields); err != nil || back != m {
		t.Fatalf("meta with token round trip: %v", err)
	}
}

func TestIssueTokenRefuses(t *testing.T) {
	_, priv := newRunKey(t)
	id, _ := newPeer(t)
	exp := time.Now().Add(time.Hour)
	for name, c := range map[string]struct {
		key ed25519.PrivateKey
		tok Token
	}{
		"short key":   {priv[:32], Token{Peer: id, RunID: "r", Expires: exp}},
		"bad run":     {priv, Token{Peer: id, RunID: "a/b", Expires: exp}},
		"no peer":     {priv, Token{RunID: "r", Expires: exp}},
		"junk peer":   {priv, Token{Peer: "junk", RunID: "r", Expires: exp}},
		"role":        {priv, Token{Peer: id, RunID: "r", Role: 9, Expires: exp}},
		"zero expiry": {priv, Token{Peer: id, RunID: "r"}},
	} {
		if _, err := IssueToken(c.key, c.tok); !errors.Is(err, ErrTokenMalformed) {
			t.Errorf("%s: %v, want ErrTokenMalformed", name, err)
		}
	}
}

func FuzzParseToken(f *testing.F) {
	_, priv := newRunKey(f)
	id, _ := newPeer(f)
	f.Add(issue(f, priv, Token{Peer: id, RunID: "run", Role: RoleObserver, Expires: time.Unix(1_900_000_000, 0)}))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 'r', 1, 0})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 255})
	pub := priv.Public().(ed25519.PublicKey)
	f.Fuzz(func(t *testing.T, b []byte) {
		tok, err := ParseToken(b)
		if err != nil {
			if !errors.Is(err, ErrTokenMalformed) {
				t.Fatalf("error %v does not match ErrTokenMalformed", err)
			}
			return
		}
		if len(b) > MaxTokenLen || tok.Role > RoleObserver || ValidateRunID(tok.RunID) != nil {
			t.Fatalf("accepted %x as %+v", b, tok)
		}
		// A token that parses re-encodes to the same fields.
		again, err := IssueToken(priv, tok)
		if err != nil {
			t.Fatalf("parsed token does not re-issue: %v", err)
		}
		if !bytes.Equal(again[:len(again)-64], b[:len(b)-64]) {
			t.Fatalf("fields %x re-encode as %x", b[:len(b)-64], again[:len(again)-64])
		}
		if _, err := VerifyToken(pub, b, tok.Peer, tok.RunID, time.Unix(0, 0)); err == nil && !bytes.Equal(again, b) {
			t.Fatalf("a second valid signature for the same fields")
		}
	})
}

// closedEvents is the member table of a closed run "run" under pub.
func closedEvents(pub ed25519.PublicKey) *events {
	ev := newEvents("run", "", nil)
	ev.setPolicy(Admission{Closed: true, RunKey: pub})
	return ev
}

// tokenMember returns a fresh identity and its signed metadata carrying
// token(id).
func tokenMember(t *testing.T, role Role, token func(id peer.ID) []byte) (peer.ID, []byte) {
	t.Helper()
	id, key := newPeer(t)
	fields, err := Meta{RunID: "run", Role: role, Token: string(token(id))}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	b, err := signMeta(key, 1, nil, 0, fields)
	if err != nil {
		t.Fatal(err)
	}
	return id, b
}

// The member table of a closed run refuses every node without a valid token
// of its own, whoever gossips it (NotifyAlive, NotifyMerge).
func TestClosedRunDelegate(t *testing.T) {
	pub, priv := newRunKey(t)
	_, otherPriv := newRunKey(t)
	ev := closedEvents(pub)
	hour := time.Now().Add(time.Hour)
	tok := func(key ed25519.PrivateKey, role Role, exp time.Time) func(peer.ID) []byte {
		return func(id peer.ID) []byte { return issue(t, key, Token{Peer: id, RunID: "run", Role: role, Expires: exp}) }
	}
	stolen, _ := newPeer(t)
	cases := []struct {
		name string
		role Role
		tok  func(peer.ID) []byte
		want error
	}{
		{"valid", RoleVolunteer, tok(priv, RoleVolunteer, hour), nil},
		{"valid observer", RoleObserver, tok(priv, RoleObserver, hour), nil},
		{"no token", RoleVolunteer, func(peer.ID) []byte { return nil }, ErrTokenMissing},
		{"forged", RoleVolunteer, tok(otherPriv, RoleVolunteer, hour), ErrTokenForged},
		{"expired", RoleVolunteer, tok(priv, RoleVolunteer, time.Now().Add(-time.Second)), ErrTokenExpired},
		{"another's token", RoleVolunteer, func(peer.ID) []byte { return tok(priv, RoleVolunteer, hour)(stolen) }, ErrTokenWrongPeer},
		{"observer token, volunteer role", RoleVolunteer, tok(priv, RoleObserver, hour), ErrTokenWrongRole},
		{"garbage", RoleVolunteer, func(peer.ID) []byte { return []byte{1, 2, 3} }, ErrTokenMalformed},
	}
	var goodNode *memberlist.Node
	for _, c := range cases {
		id, meta := tokenMember(t, c.role, c.tok)
		n := &memberlist.Node{Name: id.String(), Meta: meta}
		err := ev.NotifyAlive(n)
		if c.want == nil {
			if err != nil {
				t.Errorf("%s: refused: %v", c.name, err)
			}
			goodNode = n
			continue
		}
		if !errors.Is(err, c.want) || !errors.Is(err, ErrNotAdmitted) {
			t.Errorf("%s: NotifyAlive: %v, want %v", c.name, err, c.want)
		}
		// A push/pull carrying it is refused as a whole, except for an
		// expired token (NotifyAlive drops that node alone).
		err = ev.NotifyMerge([]*memberlist.Node{goodNode, n})
		if c.want == ErrTokenExpired {
			if err != nil {
				t.Errorf("%s: NotifyMerge: %v, want nil", c.name, err)
			}
		} else if !errors.Is(err, c.want) {
			t.Errorf("%s: NotifyMerge: %v, want %v", c.name, err, c.want)
		}
	}
	// A member whose token expires drops out of the table at its expiry,
	// and the sweep reports it failed.
	soon := time.Now().Truncate(time.Second).Add(2 * time.Second) // tokens hold whole seconds
	id, meta := tokenMember(t, RoleVolunteer, tok(priv, RoleVolunteer, soon))
	ev.NotifyJoin(&memberlist.Node{Name: id.String(), Meta: meta})
	if _, ok := ev.get(id); !ok || ev.count() != 1 {
		t.Fatal("member with a valid token not listed")
	}
	time.Sleep(time.Until(soon))
	if _, ok := ev.get(id); ok || ev.count() != 0 || len(ev.list(false)) != 0 {
		t.Error("member listed after its token expired")
	}
	if ev.admitted(id, time.Now()) {
		t.Error("member with an expired token admitted at the gate")
	}
	ev.expireTokens(time.Now())
	if len(ev.members) != 0 {
		t.Error("expired member not swept")
	}
}

// The door admits a holder of a valid token for doorTTL, and nobody else.
func TestDoor(t *testing.T) {
	pub, priv := newRunKey(t)
	_, otherPriv := newRunKey(t)
	ev := closedEvents(pub)
	now := time.Now()
	id, _ := newPeer(t)
	stranger, _ := newPeer(t)
	if ev.admitted(stranger, now) {
		t.Fatal("stranger admitted")
	}
	if err := ev.knock(stranger, "", issue(t, otherPriv, Token{Peer: stranger, RunID: "run", Expires: now.Add(time.Hour)}), now); !errors.Is(err, ErrTokenForged) {
		t.Fatalf("forged token at the door: %v", err)
	}
	if err := ev.knock(stranger, "", nil, now); !errors.Is(err, ErrTokenMissing) || ev.admitted(stranger, now) {
		t.Fatalf("no token at the door: %v", err)
	}
	if err := ev.knock(id, "", issue(t, priv, Token{Peer: id, RunID: "run", Expires: now.Add(time.Hour)}), now); err != nil {
		t.Fatal(err)
	}
	if !ev.admitted(id, now) || ev.admitted(id, now.Add(doorTTL)) {
		t.Error("door admission is not for doorTTL")
	}
	// Short tokens bound it too, and the table is bounded.
	if err := ev.knock(id, "", issue(t, priv, Token{Peer: id, RunID: "run", Expires: now.Add(time.Minute)}), now); err != nil {
		t.Fatal(err)
	}
	if ev.admitted(id, now.Add(time.Minute)) {
		t.Error("admitted past the token's expiry")
	}
	for range maxDoor + 10 {
		p, _ := newPeer(t)
		if err := ev.knock(p, "", issue(t, priv, Token{Peer: p, RunID: "run", Expires: now.Add(time.Hour)}), now); err != nil {
			t.Fatal(err)
		}
	}
	if len(ev.door) > maxDoor {
		t.Errorf("door holds %d entries, bound %d", len(ev.door), maxDoor)
	}
	// An open run has no gate.
	open := newEvents("run", "", nil)
	if !open.admitted(stranger, now) {
		t.Error("open run gates streams")
	}
}

func TestCapsDelegate(t *testing.T) {
	ev := newEvents("run", "", nil)
	ev.setPolicy(Admission{MaxMembers: 4, MaxPerPrefix: 2})
	join := func(addr string) (peer.ID, error) {
		n, _ := memberAt(t, Meta{RunID: "run"}, net.JoinHostPort(announcedIP(addr).String(), "4001"))
		id, _ := peer.Decode(n.Name)
		if err := ev.NotifyAlive(n); err != nil {
			return id, err
		}
		ev.NotifyJoin(n)
		return id, nil
	}
	for i, c := range []struct {
		addr string
		want error
	}{
		{"203.0.113.1:1", nil},
		{"203.0.113.200:1", nil},
		{"203.0.113.7:1", ErrPrefixFull}, // the same /24
		{"198.51.100.1:1", nil},
		{"2001:db8:1:2::1", nil},
		{"192.0.2.1:1", ErrRunFull},
	} {
		addr := c.addr
		if !strings.Contains(addr, ".") {
			addr = "[" + addr + "]:1"
		}
		_, err := join(addr)
		if !errors.Is(err, c.want) || (c.want != nil && !errors.Is(err, ErrNotAdmitted)) {
			t.Errorf("%d %s: %v, want %v", i, c.addr, err, c.want)
		}
	}
	if ev.count() != 4 {
		t.Errorf("%d members, want 4", ev.count())
	}
	// A member's own alive always passes, and so does a seed's.
	for _, m := range ev.list(false) {
		if err := ev.checkCaps(m); err != nil {
			t.Errorf("member refused: %v", err)
		}
	}
	seed, _ := newPeer(t)
	ev.exempt[seed] = true
	if err := ev.checkCaps(Member{ID: seed, Addr: "192.0.2.9:1"}); err != nil {
		t.Errorf("seed refused: %v", err)
	}
	// Prefix lengths are configurable.
	a := Admission{PrefixV4: 32, PrefixV6: 64}
	if a.prefix(net.ParseIP("10.0.0.1")) == a.prefix(net.ParseIP("10.0.0.2")) ||
		a.prefix(net.ParseIP("2001:db8::1")) != a.prefix(net.ParseIP("2001:db8::ffff")) ||
		(Admission{}).prefix(net.ParseIP("10.0.0.1")) != (Admission{}).prefix(net.ParseIP("10.0.0.255")) {
		t.Error("prefixes")
	}
}

func TestAdmissionAnswer(t *testing.T) {
	pub, _ := newRunKey(t)
	for _, c := range []struct {
		verdict error
		adm     Admission
	}{
		{nil, Admission{}},
		{nil, Admission{Closed: true, RunKey: pub, MaxMembers: 7}},
		{ErrTokenExpired, Admission{Closed: true, RunKey: pub}},
		{ErrPrefixFull, Admission{MaxMembers: 10, MaxPerPrefix: 2, PrefixV4: 32, PrefixV6: 64}},
	} {
		ans, err := decodeAnswer(encodeAnswer(c.verdict, c.adm))
		if err != nil || !ans.adm.Equal(c.adm) || !errors.Is(ans.verdict, c.verdict) || (c.verdict == nil) != (ans.verdict == nil) {
			t.Errorf("%v %v: got %+v %v", c.verdict, c.adm, ans, err)
		}
	}
	for _, b := range [][]byte{nil, make([]byte, admissionLen-1), append(make([]byte, 1), 2), func() []byte { b := make([]byte, admissionLen); b[1] = 2; return b }()} {
		if _, err := decodeAnswer(b); err == nil {
			t.Errorf("answer %x accepted", b)
		}
	}
}

func TestRunKeyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "run.key")
	key, err := CreateRunKey(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := LoadRunKey(path)
	if err != nil || !got.Equal(key) {
		t.Fatalf("LoadRunKey: %v", err)
	}
	if _, err := CreateRunKey(path); err == nil {
		t.Error("a second key overwrote the first")
	}
	if again, _ := LoadRunKey(path); !again.Equal(key) {
		t.Error("key file changed")
	}
	link := filepath.Join(dir, "link.key")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadRunKey(link); !errors.Is(err, ErrInsecureKey) {
		t.Errorf("symbolic link: %v", err)
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadRunKey(path); !errors.Is(err, ErrInsecureKey) {
		t.Errorf("mode 0640: %v", err)
	}
	junk := filepath.Join(dir, "junk.key")
	os.WriteFile(junk, []byte("not a key"), 0o600)
	if _, err := LoadRunKey(junk); err == nil {
		t.Error("junk accepted")
	}
	pub := key.Public().(ed25519.PublicKey)
	if back, err := DecodeRunKey(EncodeRunKey(pub)); err != nil || !back.Equal(pub) {
		t.Errorf("run key text: %v", err)
	}
	if _, err := DecodeRunKey("AAAA"); err == nil {
		t.Error("short run key accepted")
	}
}
