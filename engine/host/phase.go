package host

import (
	"errors"
	"fmt"
)

// Phase is where a supervised plugin stands. It is a type, not text, so
// an engine switches on it and a page renders it; the words an operator
// reads (ProvisionerStatus.Process) are made from it, never parsed back.
type Phase int

const (
	// PhaseStarting: the first launch is under way.
	PhaseStarting Phase = iota + 1
	// PhaseRunning: the plugin is configured and its calls can succeed.
	PhaseRunning
	// PhaseRestarting: the process exited on its own; another is being
	// started with backoff.
	PhaseRestarting
	// PhaseWedged: the process missed its deadlines and is being killed
	// so that it restarts.
	PhaseWedged
	// PhaseFailed: the plugin cannot run and will not be started again
	// until a person acts; ProvisionerStatus.Failure says why and what
	// to do.
	PhaseFailed
	// PhaseStopped: the engine shut it down.
	PhaseStopped
)

var phaseNames = map[Phase]string{
	PhaseStarting: "starting", PhaseRunning: "running", PhaseRestarting: "restarting",
	PhaseWedged: "wedged", PhaseFailed: "failed", PhaseStopped: "stopped",
}

func (p Phase) String() string {
	if s, ok := phaseNames[p]; ok {
		return s
	}
	return fmt.Sprintf("phase(%d)", int(p))
}

// MarshalText renders the phase as its name, for JSON.
func (p Phase) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// ErrKindMismatch means the plugin says it is of another kind than its
// provisioner block names: LaunchBlock's diagnostic carries it in Extra.
var ErrKindMismatch = errors.New("plugin is of another kind than its block says")
