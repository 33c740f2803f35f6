package slurm

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/fluksio/provision/slurm/sbatch"
)

// A profile's numbers (cpus, gpus, ram_mb, nodes) are the one source of
// truth: the engine matches needs and mints credentials for them. So an
// sbatch option that restates one must restate it exactly, and one that
// contradicts it is refused at validation, with both values and what to
// write instead (docs/design/slurm-contradictions.md).
//
// --nodes, --ntasks and --ntasks-per-node are not restated at all: they
// are reserved (config.go), nodes = N says it.

// contradiction says which of the profile's numbers the option o
// contradicts, and how, or "" when it agrees (or says nothing about
// them).
func contradiction(p Profile, o sbatch.Opt) (summary, detail string) {
	name := o.Name()
	write := func(attr string, v int64) string {
		return fmt.Sprintf("Remove %s (the provisioner asks for the profile's %s itself) or set %s = %d.", name, attr, attr, v)
	}
	switch {
	case o.Is("--cpus-per-task", 'c'):
		n, ok := count(o.Value)
		if ok && n != int64(p.CPUs) {
			return "Contradictory sbatch option", fmt.Sprintf("%s=%s asks Slurm for %d CPUs a machine, but cpus = %d is what the engine places work for. %s",
				name, o.Value, n, p.CPUs, write("cpus", n))
		}
	case o.Is("--cpus-per-gpu", 0):
		n, ok := count(o.Value)
		switch {
		case ok && p.GPUs == 0:
			return "Contradictory sbatch option", fmt.Sprintf("%s=%s asks for CPUs per GPU, but the profile has gpus = 0. Remove it, or set gpus.", name, o.Value)
		case ok && n*int64(p.GPUs) != int64(p.CPUs):
			return "Contradictory sbatch option", fmt.Sprintf("%s=%s with gpus = %d asks Slurm for %d CPUs a machine, but cpus = %d. %s",
				name, o.Value, p.GPUs, n*int64(p.GPUs), p.CPUs, write("cpus", n*int64(p.GPUs)))
		}
	case o.Is("--mem", 0), o.Is("--mem-per-cpu", 0), o.Is("--mem-per-gpu", 0):
		mb, ok := megabytes(o.Value)
		if !ok {
			return "", ""
		}
		per, of := int64(1), ""
		switch {
		case o.Is("--mem-per-cpu", 0) && !o.Is("--mem", 0):
			per, of = int64(p.CPUs), fmt.Sprintf(" (× cpus = %d)", p.CPUs)
		case o.Is("--mem-per-gpu", 0) && !o.Is("--mem", 0):
			per, of = int64(p.GPUs), fmt.Sprintf(" (× gpus = %d)", p.GPUs)
		}
		total := mb * per
		switch {
		case mb == 0 && p.RAMMB > 0:
			return "Contradictory sbatch option", fmt.Sprintf("%s=0 asks Slurm for all of a node's memory, which ram_mb = %d cannot say. Remove %s and keep ram_mb, or set ram_mb = 0 (unknown).", name, p.RAMMB, name)
		case mb > 0 && p.RAMMB > 0 && total != p.RAMMB:
			return "Contradictory sbatch option", fmt.Sprintf("%s=%s asks Slurm for %d MB a machine%s, but ram_mb = %d is what the engine places work for. %s",
				name, o.Value, total, of, p.RAMMB, write("ram_mb", total))
		case mb > 0 && p.RAMMB == 0:
			return "Memory asked for but not said", fmt.Sprintf("%s=%s asks Slurm for %d MB a machine%s, but ram_mb = 0 tells the engine the machine's memory is unknown, so a need for any amount would be sent to it. Set ram_mb = %d and remove %s.",
				name, o.Value, total, of, total, name)
		}
	case o.Is("--gres", 0):
		n, ok := gresGPUs(o.Value)
		if ok && n != int64(p.GPUs) {
			return "Contradictory sbatch option", fmt.Sprintf("%s=%s asks Slurm for %d GPUs a machine, but gpus = %d is what the engine places work for. %s",
				name, o.Value, n, p.GPUs, write("gpus", n))
		}
	case o.Is("--gpus", 'G'), o.Is("--gpus-per-node", 0), o.Is("--gpus-per-task", 0):
		// One task a node (nodes = N), so per node and per task are per
		// machine too.
		_, c, _ := cutLast(o.Value, ":")
		n, ok := count(c)
		if ok && n != int64(p.GPUs) {
			return "Contradictory sbatch option", fmt.Sprintf("%s=%s asks Slurm for %d GPUs a machine, but gpus = %d is what the engine places work for. %s",
				name, o.Value, n, p.GPUs, write("gpus", n))
		}
	}
	return "", ""
}

// count reads a non-negative count; false when v is not one (Slurm will
// say what is wrong with it).
func count(v string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	return n, err == nil && n >= 0
}

// megabytes reads a Slurm memory size: a number with an optional unit (K,
// M, G or T; M when none), in MB.
func megabytes(v string) (int64, bool) {
	v = strings.ToUpper(strings.TrimSpace(v))
	unit := int64(1)
	div := int64(1)
	if v != "" {
		switch v[len(v)-1] {
		case 'K':
			div = 1024
		case 'M':
		case 'G':
			unit = 1024
		case 'T':
			unit = 1024 * 1024
		default:
			return count(v)
		}
		v = v[:len(v)-1]
	}
	n, ok := count(v)
	if !ok {
		return 0, false
	}
	return n * unit / div, true
}

// gresGPUs is how many GPUs a --gres list asks for ("gpu:2",
// "gpu:a100:2", "gpu" for one, "gpu:2,lustre:1"); false when it names no
// gpu.
func gresGPUs(list string) (int64, bool) {
	var total int64
	found := false
	for _, g := range strings.Split(list, ",") {
		name, rest, _ := strings.Cut(strings.TrimSpace(g), ":")
		if name != "gpu" {
			continue
		}
		found = true
		if rest == "" {
			total++
			continue
		}
		// gpu:type:N or gpu:N; a type alone is one.
		_, c, _ := cutLast(rest, ":")
		if n, ok := count(c); ok {
			total += n
		} else if !strings.Contains(rest, ":") {
			total++
		} else {
			return 0, false
		}
	}
	return total, found
}

// cutLast splits s at its last sep: ("a100", "2") from "a100:2", ("", "2")
// from "2".
func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return "", s, false
}
