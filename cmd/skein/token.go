package main

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/urfave/cli/v2"

	"github.com/skein-ml/skein/p2p"
)

func tokenCommand() *cli.Command {
	keygen := &cli.Command{
		Name:  "keygen",
		Usage: "make the run key of a closed run",
		Description: "Writes a new ed25519 run key to FILE (PEM PKCS #8, mode 0600; an existing file is never\n" +
			"overwritten) and prints the line to put in the run's manifest:\n\n" +
			"  [admission]\n  mode = \"closed\"\n  run_key = \"...\"\n\n" +
			"Keep FILE with the run's operator: whoever holds it can admit anyone. The bootstrap does not\n" +
			"need it (give it a token of role bootstrap), but may hold it (`skein bootstrap --run-key`) to\n" +
			"issue and renew its own.",
		Flags: []cli.Flag{
			&cli.PathFlag{Name: "out", Required: true, Usage: "file to write the run key to (must not exist)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("unexpected argument %q", c.Args().First())
			}
			priv, err := p2p.CreateRunKey(c.Path("out"))
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "wrote the run key to %s; put this in the run's manifest:\n\n[admission]\nmode = \"closed\"\n", c.Path("out"))
			fmt.Fprintf(os.Stdout, "run_key = %q\n", p2p.EncodeRunKey(priv.Public().(ed25519.PublicKey)))
			return nil
		},
	}
	issue := &cli.Command{
		Name:  "issue",
		Usage: "sign a join token for one node of a closed run",
		Description: "Signs a token with the run key that lets the node with peer ID PEERID take part in run RUNID\n" +
			"as ROLE until TTL from now, and prints it (URL-safe base64) on stdout. The node joins with\n" +
			"`skein node join --token TOKEN` (or --token @FILE). A node prints its peer ID when a closed run\n" +
			"refuses it, and at every start (\"joined run ... as PEERID\"). Tokens cannot be revoked: keep\n" +
			"TTL short and issue new ones; a member drops out of every member list when its token expires.",
		Flags: []cli.Flag{
			&cli.PathFlag{Name: "key", Required: true, Usage: "the run key file (`skein token keygen`)"},
			&cli.StringFlag{Name: "peer", Required: true, Usage: "the node's peer ID (12D3Koo...)"},
			&cli.StringFlag{Name: "run", Required: true, Usage: "the run ID"},
			&cli.StringFlag{Name: "role", Value: "volunteer", Usage: "volunteer, bootstrap or observer: what the node says it is in membership"},
			&cli.DurationFlag{Name: "ttl", Value: 720 * time.Hour, Usage: "how long the token is valid"},
			&cli.PathFlag{Name: "out", Usage: "also write the token to this file (mode 0600), for --token @FILE"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("unexpected argument %q", c.Args().First())
			}
			id, err := peer.Decode(c.String("peer"))
			if err != nil {
				return fmt.Errorf("--peer %q: %w", c.String("peer"), err)
			}
			role, err := parseRole(c.String("role"))
			if err != nil {
				return err
			}
			if c.Duration("ttl") <= 0 {
				return fmt.Errorf("--ttl %v must be positive", c.Duration("ttl"))
			}
			key, err := p2p.LoadRunKey(c.Path("key"))
			if err != nil {
				return err
			}
			tok := p2p.Token{Peer: id, RunID: c.String("run"), Role: role, Expires: time.Now().Add(c.Duration("ttl"))}
			b, err := p2p.IssueToken(key, tok)
			if err != nil {
				return err
			}
			text := p2p.EncodeToken(b)
			if out := c.Path("out"); out != "" {
				f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
				if err != nil {
					return fmt.Errorf("--out: %w", err)
				}
				if _, err := fmt.Fprintln(f, text); err != nil {
					f.Close()
					return fmt.Errorf("--out: %w", err)
				}
				if err := f.Close(); err != nil {
					return fmt.Errorf("--out: %w", err)
				}
			}
			fmt.Fprintf(os.Stderr, "token: %s\n", tok)
			fmt.Fprintln(os.Stdout, text)
			return nil
		},
	}
	show := &cli.Command{
		Name:      "show",
		Usage:     "print what a join token says",
		ArgsUsage: "TOKEN|@FILE",
		Description: "Prints a token's peer ID, run, role and expiry. With --run-key (the manifest's admission.run_key)\n" +
			"it also checks the signature.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "run-key", Usage: "the run's public key, to check the signature"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("want one argument, the token or @FILE (got %d)", c.NArg())
			}
			b, err := readToken(c.Args().First())
			if err != nil {
				return err
			}
			t, err := p2p.ParseToken(b)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stdout, "peer    %s\nrun     %s\nrole    %s\nexpires %s\n", t.Peer, t.RunID, t.Role, t.Expires.UTC().Format(time.RFC3339))
			if s := c.String("run-key"); s != "" {
				pub, err := p2p.DecodeRunKey(s)
				if err != nil {
					return err
				}
				if _, err := p2p.VerifyToken(pub, b, t.Peer, t.RunID, time.Now()); err != nil {
					return err
				}
				fmt.Fprintln(os.Stdout, "signed by the run key, valid now")
			}
			return nil
		},
	}
	return &cli.Command{
		Name:  "token",
		Usage: "run keys and join tokens of closed runs",
		Description: "A run whose manifest says [admission] mode = \"closed\" admits only nodes holding a join token:\n" +
			"the run key (keygen) signs a node's peer ID, the run ID, its role and an expiry (issue). Every\n" +
			"member checks every other's token when it joins membership and on every protocol stream.",
		Subcommands: []*cli.Command{keygen, issue, show},
	}
}

func parseRole(s string) (p2p.Role, error) {
	for _, r := range []p2p.Role{p2p.RoleVolunteer, p2p.RoleBootstrap, p2p.RoleObserver} {
		if r.String() == s {
			return r, nil
		}
	}
	return 0, fmt.Errorf("--role %q: want volunteer, bootstrap or observer", s)
}

// readToken reads a --token value: the token itself, or @FILE holding it.
func readToken(v string) ([]byte, error) {
	if name, ok := strings.CutPrefix(v, "@"); ok {
		f, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("token: %w", err)
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, 4096))
		if err != nil {
			return nil, fmt.Errorf("token: %w", err)
		}
		v = string(b)
	}
	b, err := p2p.DecodeToken(v)
	if err != nil {
		return nil, fmt.Errorf("token: %w", err)
	}
	return b, nil
}

// tokenHint adds to a refusal by a closed run what to do about it.
func tokenHint(err error, role string) error {
	var refused *p2p.NotAdmittedError
	if !errors.As(err, &refused) || !p2p.IsTokenError(err) {
		return err
	}
	return fmt.Errorf("%w\n\nrun %q is closed. Send this node's peer ID to the run's operator, who makes a token with\n"+
		"  skein token issue --key RUN-KEY --peer %s --run %s --role %s\n"+
		"then start again with --token TOKEN (or --token @FILE)", err, refused.RunID, refused.Self, refused.RunID, role)
}
