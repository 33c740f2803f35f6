package supervise

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
)

// UnfixableError is a launch that failed for a reason another launch of
// the same binary with the same configuration cannot fix: the binary no
// longer matches its pin (shared.ErrChecksumMismatch), it speaks another
// protocol version (shared.ErrIncompatible), or it is of another kind
// (host.ErrKindMismatch). The Supervisor stops there, with phase failed,
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
var unfixableCauses = []error{host.ErrKindMismatch, shared.ErrChecksumMismatch, shared.ErrIncompatible}

// unfixable finds, among a launch's diagnostics, one that
// host.LaunchBlock marked (Extra holds the launch's error) with a cause a
// restart cannot fix. The mark rides on the diagnostic so that
// host.Validate, Check and Preview, which launch the same way, keep
// their signatures; nil when there is none.
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
