package pipeline_test

import (
	"fmt"

	"github.com/skein-ml/skein/pipeline"
	"github.com/skein-ml/skein/sim"
)

// Plan a placement on the shipped 20-node network, schedule an iteration at
// the paper's defaults (6 stages, L = 4, mu = 3), check it, and cost it.
func Example() {
	net, err := sim.Builtin("volunteers20")
	if err != nil {
		panic(err)
	}
	pl, err := pipeline.Plan(net, pipeline.DefaultPlanConfig(), nil)
	if err != nil {
		panic(err)
	}
	cfg := pipeline.DefaultScheduleConfig()
	sc, err := pipeline.SchedulePaths(net, pl, cfg)
	if err != nil {
		panic(err)
	}
	fmt.Println("stage-0 nodes:", len(pl.Nodes(0)))
	fmt.Println("microbatches:", len(sc.Paths), "of", cfg.Rules.PathLen(), "stages each")
	fmt.Println("valid:", pipeline.Validate(sc.Paths, pl, cfg.Rules) == nil)
	fmt.Println("search helped:", sc.Iteration < sc.Greedy)
	// Output:
	// stage-0 nodes: 3
	// microbatches: 9 of 4 stages each
	// valid: true
	// search helped: true
}
