package host

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/shared"
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
	// until a person acts; Supervisor.Err says why and what to do.
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
// provisioner block names.
var ErrKindMismatch = errors.New("plugin is of another kind than its block says")

// UnfixableError is a launch that failed for a reason another launch of
// the same binary with the same configuration cannot fix: the binary no
// longer matches its pin (shared.ErrChecksumMismatch), it speaks another
// protocol version (shared.ErrIncompatible), or it is of another kind
// (ErrKindMismatch). The Supervisor stops there, with phase failed,
// rather than restarting it every two minutes for ever.
type UnfixableError struct {
	// Provisioner is the block's name.
	Provisioner string
	// Cause is one of the three sentinels above, for errors.Is.
	Cause error
	// Detail is what the launch said, with what to do.
	Detail string
}

func (e *UnfixableError) Error() string {
	// Launch's own words already name the provisioner.
	detail := strings.TrimPrefix(e.Detail, fmt.Sprintf("provisioner %q: ", e.Provisioner))
	return fmt.Sprintf("provisioner %q will not be restarted, as no restart can fix this: %s Restart the engine once it is fixed.", e.Provisioner, detail)
}

func (e *UnfixableError) Unwrap() error { return e.Cause }

// unfixableCauses are the launch errors a restart cannot fix.
var unfixableCauses = []error{ErrKindMismatch, shared.ErrChecksumMismatch, shared.ErrIncompatible}

// unfixable finds, among a launch's diagnostics, one that resolve marked
// (Extra holds the launch's error) with a cause a restart cannot fix.
// The mark rides on the diagnostic so that Validate, Check and Preview,
// which share resolve, keep their signatures; nil when there is none.
func unfixable(name string, diags hcl.Diagnostics) *UnfixableError {
	for _, d := range diags {
		err, ok := d.Extra.(error)
		if !ok || d.Severity != hcl.DiagError {
			continue
		}
		for _, cause := range unfixableCauses {
			if errors.Is(err, cause) {
				return &UnfixableError{Provisioner: name, Cause: cause, Detail: d.Detail}
			}
		}
	}
	return nil
}
