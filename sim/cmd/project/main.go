// Command project regenerates the projection of the outer-step designs to
// 10,000 volunteers (sim.Project) as a markdown report and an SVG plot:
//
//	go run ./sim/cmd/project                 # writes bench/results/projection.{md,svg}
//	go run ./sim/cmd/project -out /tmp/proj  # elsewhere
//
// It is the only part of sim that touches the disk.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/skein-ml/skein/sim"
)

func main() {
	out := flag.String("out", filepath.Join("bench", "results"), "directory for projection.md and projection.svg")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "project:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	p, err := sim.Project(sim.DefaultProjectionConfig())
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := map[string][]byte{"projection.md": []byte(p.Markdown()), "projection.svg": p.SVG()}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("wrote %s and %s\n", filepath.Join(dir, "projection.md"), filepath.Join(dir, "projection.svg"))
	return nil
}
