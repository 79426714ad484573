package trainer

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
)

// ErrMemory is returned (wrapped) by NewSetup for a model that needs more
// memory than is available; nothing was allocated.
var ErrMemory = errors.New("trainer: model does not fit in memory")

// memoryNeed estimates the bytes a setup of model mc at batch B x T takes:
// parameters, gradients and the two AdamW moments (four float32 copies),
// hostCopies more copies of the parameters kept by the caller (an outer
// optimizer's phi, momentum and buffers), and the activations of one batch.
func memoryNeed(mc model.Config, B, T, hostCopies int) uint64 {
	return StageMemoryNeed(mc, model.FullSpec(mc), B, T, hostCopies)
}

// MemoryNeed is the estimate NewSetup checks (memoryNeed): what training
// model mc at batch B x T takes, with hostCopies more copies of the
// parameters kept beside it.
func MemoryNeed(mc model.Config, B, T, hostCopies int) uint64 {
	return memoryNeed(mc, B, T, hostCopies)
}

// stageParams is the parameter count of stage spec of mc.
func stageParams(mc model.Config, spec model.StageSpec) uint64 {
	var n uint64
	for _, t := range model.Layout(mc, spec) {
		n += uint64(t.Size())
	}
	return n
}

// StageMemoryNeed is memoryNeed for one stage of a pipeline: its
// parameters' four copies and hostCopies more, and its activations.
func StageMemoryNeed(mc model.Config, spec model.StageSpec, B, T, hostCopies int) uint64 {
	return stageBytes(mc, spec, model.ActivationFloats(mc, spec, B, T), hostCopies)
}

// stageBytes is a stage's parameters' four copies and hostCopies more, and
// acts float32s of activations, in bytes.
func stageBytes(mc model.Config, spec model.StageSpec, acts int64, hostCopies int) uint64 {
	return 4 * ((4+uint64(hostCopies))*stageParams(mc, spec) + uint64(acts))
}

// stageMemoryOn is StageMemoryNeed with the activations of the attention
// dev runs (model.ActivationFloatsOn: the fused attention keeps (B,NH,T)
// per layer, not (B,NH,T,T)); dev not a kernels.Device gives the upper
// bound.
func stageMemoryOn(dev any, mc model.Config, spec model.StageSpec, B, T, hostCopies int) uint64 {
	d, ok := dev.(kernels.Device)
	if !ok {
		return StageMemoryNeed(mc, spec, B, T, hostCopies)
	}
	return stageBytes(mc, spec, model.ActivationFloatsOn(d, mc, spec, B, T), hostCopies)
}

// CheckStageMemory refuses a staged volunteer that could be placed on a
// stage it cannot hold: every stage of specs is checked as NewSetup checks
// a whole model (available, dev: as there). The stages differ in what
// dominates (the embedding stage in parameters, the head's in logits), so
// each is checked, not one "largest".
func CheckStageMemory(mc model.Config, specs []model.StageSpec, B, T, hostCopies int, available uint64, dev any) error {
	for i, sp := range specs {
		name := fmt.Sprintf("stage %d of %d (%s) of the %s model", i, len(specs), sp.Holds(), mc.Name)
		if err := checkSpecMemory(mc, sp, name, B, T, hostCopies, available, dev); err != nil {
			return err
		}
	}
	return nil
}

// MemAvailable is the system's available memory (MemAvailable of
// /proc/meminfo); false where it cannot be known.
func MemAvailable() (uint64, bool) { return systemMemAvailable() }

// deviceMemory is a device with memory of its own (a GPU): the stage's
// parameters, gradients, moments and activations live there, and only the
// caller's copies on the host.
type deviceMemory interface {
	MemInfo() (free, total uint64, err error)
	Name() string
}

// checkMemory refuses a setup that needs more than the memory available:
// available if not 0, else the system's figure (none: no check). On a
// device with its own memory, the stage is held to the device's free
// memory and only the caller's copies to the host's.
func checkMemory(mc model.Config, B, T, hostCopies int, available uint64, dev any) error {
	return checkSpecMemory(mc, model.FullSpec(mc), "the "+mc.Name+" model", B, T, hostCopies, available, dev)
}

func checkSpecMemory(mc model.Config, spec model.StageSpec, name string, B, T, hostCopies int, available uint64, dev any) error {
	what := "weights, gradients, AdamW moments, outer state and activations"
	need := stageMemoryOn(dev, mc, spec, B, T, hostCopies)
	if dm, ok := dev.(deviceMemory); ok {
		free, _, err := dm.MemInfo()
		if err != nil {
			return err
		}
		onDev := stageMemoryOn(dev, mc, spec, B, T, 0)
		if onDev > free {
			return fmt.Errorf("%w: %s at batch %d x %d needs about %.2f GiB on %s (weights, gradients, AdamW moments and activations), but %.2f GiB of it is free; use a smaller model or batch",
				ErrMemory, name, B, T, gib(onDev), dm.Name(), gib(free))
		}
		need, what = 4*uint64(hostCopies)*stageParams(mc, spec), "outer state, on the host"
	}
	if available == 0 {
		var ok bool
		if available, ok = systemMemAvailable(); !ok {
			return nil
		}
	}
	if need <= available {
		return nil
	}
	return fmt.Errorf("%w: %s at batch %d x %d needs about %.2f GiB (%s), but %.2f GiB is available; use a smaller model or batch",
		ErrMemory, name, B, T, gib(need), what, gib(available))
}

func gib(b uint64) float64 { return float64(b) / (1 << 30) }

// systemMemAvailable is MemAvailable of /proc/meminfo on Linux: memory that
// can be given to a new program without swapping. Elsewhere, or when it
// cannot be read, it reports false.
func systemMemAvailable() (uint64, bool) {
	if runtime.GOOS != "linux" {
		return 0, false
	}
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	return parseMemAvailable(b)
}

// parseMemAvailable reads the "MemAvailable: N kB" line of /proc/meminfo.
func parseMemAvailable(meminfo []byte) (uint64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) == 3 && string(f[0]) == "MemAvailable:" && string(f[2]) == "kB" {
			kb, err := strconv.ParseUint(string(f[1]), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}
