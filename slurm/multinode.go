package slurm

// Multi-node profiles: nodes = N makes one allocation of N nodes, and the
// job runs one worker on each with srun, each a machine of its own with
// its own name and credential, since a worker is one process on one host.
// Caps and demand count machines; the provisioner asks for and gives up
// whole allocations (docs/design/slurm-multinode.md).

import (
	"strconv"
	"strings"
)

// maxNodes bounds nodes in a profile: far above what one workflow stage
// asks for, so that counts stay small.
const maxNodes = 4096

// tokenVarOf is the variable that carries the credential of node i of an
// allocation until its task picks it.
func tokenVarOf(i int) string { return tokenVar + "_" + strconv.Itoa(i) }

// machineName names a machine of a submission whose tag is base: base for
// a job of one machine, base-<task> for an array task, and -n<node> after
// either for a node of a multi-node allocation (node is -1 otherwise).
func machineName(base string, task, node int) string {
	name := base
	if task >= 0 {
		name += "-" + strconv.Itoa(task)
	}
	if node >= 0 {
		name += "-n" + strconv.Itoa(node)
	}
	return name
}

// cutNode splits a multi-node machine's name into its allocation's name
// and its node; node is -1 for a name without the -n<node> suffix.
func cutNode(worker string) (alloc string, node int) {
	i := strings.LastIndex(worker, "-n")
	if i <= 0 || !isDigits(worker[i+2:], 4) {
		return worker, -1
	}
	n, _ := strconv.Atoi(worker[i+2:])
	return worker[:i], n
}

// roundToAllocations is n machines of a profile of nodes nodes rounded up
// to whole allocations; whole is the same rounded down.
func roundToAllocations(n, nodes int) (up, whole int) {
	if nodes <= 1 {
		return n, n
	}
	return (n + nodes - 1) / nodes * nodes, n / nodes * nodes
}

// nodeScript is what srun runs on each node of an allocation: it takes
// the credential of its own task (SLURM_PROCID, one task per node) into
// FLUKSIO_WORKER_TOKEN, drops every sibling's and execs the worker.
func nodeScript(nodes int, command string) string {
	var b strings.Builder
	var all []string
	b.WriteString(`case "${SLURM_PROCID:-}" in` + "\n")
	for i := range nodes {
		all = append(all, tokenVarOf(i))
		b.WriteString(strconv.Itoa(i) + ") " + tokenVar + `="$` + tokenVarOf(i) + `" ;;` + "\n")
	}
	b.WriteString(`*) echo "fluksio: no credential for node task '${SLURM_PROCID:-}'" >&2; exit 1 ;;` + "\n")
	b.WriteString("esac\n")
	b.WriteString("unset " + strings.Join(all, " ") + "\n")
	b.WriteString("export " + tokenVar + "\n")
	b.WriteString("exec " + command)
	return b.String()
}

// machinesOf is the machines of a queue row whose worker (machineWorker)
// is worker: that worker, or for a profile of several nodes one per node.
// The profile as configured now says how many: a nodes changed since the
// job was submitted makes names that never attach, and attach_timeout
// ends the job.
func (s *settings) machinesOf(profile, worker string) []string {
	prof, _ := s.profile(profile)
	if prof.Nodes <= 1 {
		return []string{worker}
	}
	out := make([]string, prof.Nodes)
	for j := range out {
		out[j] = machineName(worker, -1, j)
	}
	return out
}
