package data

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// GoRoot returns the Go installation whose sources form the default corpus:
// $GOROOT if set, else the output of `go env GOROOT`, else the GOROOT this
// binary was built with.
func GoRoot() (string, error) {
	if r := os.Getenv("GOROOT"); r != "" {
		return r, nil
	}
	if out, err := exec.Command("go", "env", "GOROOT").Output(); err == nil {
		if r := strings.TrimSpace(string(out)); r != "" {
			return r, nil
		}
	}
	//lint:ignore SA1019 last resort when neither $GOROOT nor the go command is available.
	if r := runtime.GOROOT(); r != "" {
		return r, nil
	}
	return "", errors.New("data: cannot locate GOROOT: $GOROOT is unset, `go env GOROOT` failed and the binary records none")
}

// DefaultCorpusPaths returns the default corpus: the Go standard library's
// sources, GoRoot()/src.
func DefaultCorpusPaths() ([]string, error) {
	root, err := GoRoot()
	if err != nil {
		return nil, err
	}
	src := filepath.Join(root, "src")
	if _, err := os.Stat(src); err != nil {
		return nil, fmt.Errorf("data: default corpus: %w", err)
	}
	return []string{src}, nil
}

// DefaultCorpusConfig returns the configuration of the default corpus: the
// .go files of DefaultCorpusPaths, without testdata directories.
func DefaultCorpusConfig() (CorpusConfig, error) {
	paths, err := DefaultCorpusPaths()
	if err != nil {
		return CorpusConfig{}, err
	}
	return CorpusConfig{Paths: paths, Filter: GoSources}, nil
}

// OpenDefault opens the default corpus (see DefaultCorpusConfig).
func OpenDefault() (*Corpus, error) {
	cfg, err := DefaultCorpusConfig()
	if err != nil {
		return nil, err
	}
	return Open(cfg)
}

// OpenPaths opens the corpus of paths (every visible file under them), or
// the default corpus when paths is empty, holding out valFraction of the
// files for validation (0: DefaultValFraction).
func OpenPaths(paths []string, valFraction float64) (*Corpus, error) {
	cfg := CorpusConfig{Paths: paths}
	if len(paths) == 0 {
		var err error
		if cfg, err = DefaultCorpusConfig(); err != nil {
			return nil, err
		}
	}
	cfg.ValFraction = valFraction
	return Open(cfg)
}
