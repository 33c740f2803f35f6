package worker

import (
	"encoding/base64"
	"strconv"
	"strings"
)

// What a worker offers at attach is what its flags say, or more where
// Slurm gave its job more:
//
//   - CPUs: SLURM_CPUS_ON_NODE when it is larger than --cpus, always. A
//     partition with OverSubscribe=EXCLUSIVE gives a one-CPU job the
//     whole node, and those CPUs are the job's (its cgroup holds them).
//   - memory and GPUs, with --size-from-job (a profile asking for whole
//     nodes): SLURM_MEM_PER_NODE (MB), and the job's GPUs, counted in
//     CUDA_VISIBLE_DEVICES, else SLURM_GPUS_ON_NODE. Without it, a job's
//     memory is what --mem asked for, and GPUs it was not asked for are
//     not its own to split.
//
// Never less than the flags: the engine placed work by them. And never
// more than the worker's credential allows: the engine refuses a worker
// that claims more than its credential was minted for (a worker that
// says it has more than its job was given is misconfigured or lying), and
// a credential is minted for the profile's shape, so a profile that is
// not exclusive gains nothing from a larger job but a line in the log
// saying so.

// jobSize is what the job got and what the worker offers.
type jobSize struct {
	cpus, gpus int
	ramMB      int64
	// notes are lines for the log: what the job got beyond the flags
	// that the credential does not allow.
	notes []string
}

// sizeOf works out what a worker offers from its flags, the job's
// variables (getenv) and its credential's claims (credentialShape).
func sizeOf(cpus, gpus int, ramMB int64, fromJob bool, getenv func(string) string, token string) jobSize {
	s := jobSize{cpus: cpus, gpus: gpus, ramMB: ramMB}
	credCPUs, credGPUs, credRAM, hasCred := credentialShape(token)
	if n, ok := positive(getenv("SLURM_CPUS_ON_NODE")); ok && int(n) > s.cpus {
		s.cpus = int(n)
	}
	if fromJob {
		if n, ok := positive(getenv("SLURM_MEM_PER_NODE")); ok && n > s.ramMB {
			s.ramMB = n
		}
		if n := jobGPUs(getenv); n > s.gpus {
			s.gpus = n
		}
	}
	if !hasCred {
		// A credential of another format: the flags, which the
		// provisioner minted it for.
		if s.cpus != cpus || s.gpus != gpus || s.ramMB != ramMB {
			s.notes = append(s.notes, "the job got more than the flags say, but the credential's shape cannot be read; offering the flags' figures")
		}
		s.cpus, s.gpus, s.ramMB = cpus, gpus, ramMB
		return s
	}
	clamp := func(what string, got, allowed int64) int64 {
		if got > allowed {
			s.notes = append(s.notes, "the job got "+strconv.FormatInt(got, 10)+" "+what+"; offering "+strconv.FormatInt(allowed, 10)+
				", what its credential allows (a profile with exclusive = true offers a whole node)")
			return allowed
		}
		return got
	}
	s.cpus = int(clamp("cpus", int64(s.cpus), int64(max(cpus, credCPUs))))
	s.gpus = int(clamp("gpus", int64(s.gpus), int64(max(gpus, credGPUs))))
	s.ramMB = clamp("MB of memory", s.ramMB, max(ramMB, credRAM))
	return s
}

// jobGPUs is how many GPUs Slurm gave the job: the devices in
// CUDA_VISIBLE_DEVICES, else SLURM_GPUS_ON_NODE; 0 when neither says.
func jobGPUs(getenv func(string) string) int {
	if v := strings.TrimSpace(getenv("CUDA_VISIBLE_DEVICES")); v != "" {
		n := 0
		for _, d := range strings.Split(v, ",") {
			if strings.TrimSpace(d) != "" {
				n++
			}
		}
		return n
	}
	if n, ok := positive(getenv("SLURM_GPUS_ON_NODE")); ok {
		return int(n)
	}
	return 0
}

// positive reads a count Slurm set: a positive integer.
func positive(v string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	return n, err == nil && n > 0
}

// credentialShape reads the cpus, gpus and ram_mb a credential was
// minted for from its payload (engine/host/credential.go: "v2", expiry,
// provisioner, cpus, gpus, ram_mb, labels, worker, newline-separated,
// base64url before the dot). It is the engine's to verify; the worker
// only reads how much it may offer. ok is false for any other format.
func credentialShape(token string) (cpus, gpus int, ramMB int64, ok bool) {
	payload, _, found := strings.Cut(strings.TrimSpace(token), ".")
	if !found {
		return 0, 0, 0, false
	}
	b, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return 0, 0, 0, false
	}
	f := strings.Split(string(b), "\n")
	if len(f) != 8 || f[0] != "v2" {
		return 0, 0, 0, false
	}
	c, errC := strconv.Atoi(f[3])
	g, errG := strconv.Atoi(f[4])
	r, errR := strconv.ParseInt(f[5], 10, 64)
	if errC != nil || errG != nil || errR != nil {
		return 0, 0, 0, false
	}
	return c, g, r, true
}
