package slurm

import (
	"fmt"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/sbatch"
)

// Every job this provisioner submits carries a tag in its comment:
//
//	fluksio:v2:<engine id>:<credential epoch>:<worker>
//
// and is named fluksio-<provisioner>. The name lets one squeue --name
// list them; the tag decides what is ours. A job is this provisioner's
// to adopt, watch or cancel only if its tag names this engine; anything
// else under the same name and user (a person's own job called
// fluksio-hpc, a staging engine beside production with the same
// provisioner name) is never touched, not even logged above debug.
//
// The epoch is the engine's CredentialEpoch: it changes exactly when the
// engine's signing secret does. A job of this engine from another epoch
// holds a credential the engine no longer accepts, so its worker can
// never attach; it is cancelled rather than adopted, pending or running.
//
// The tag's form is sbatch.Tag's; why a tag: docs/design/slurm-tags.md.

// comment is the tag of worker's job under these settings.
func (s *settings) comment(worker string) string {
	return sbatch.Tag{Engine: s.engineID, Epoch: s.epoch, Worker: worker}.Comment()
}

// ours reports whether a job with this comment belongs to this engine.
func (s *settings) ours(comment string) (sbatch.Tag, bool) {
	t, ok := sbatch.ParseTag(comment)
	return t, ok && t.Engine == s.engineID
}

// identity fills in the engine id and epoch from Configure. An engine
// that does not say (an older host, the conformance kit) gets the
// provisioner's name as its id, which is what the job name already
// implied, and epoch "0".
func (s *settings) identity(engineID, epoch string) error {
	if engineID == "" {
		engineID = s.name
	}
	if epoch == "" {
		epoch = "0"
	}
	for _, v := range []string{engineID, epoch} {
		if !shared.ValidName(v) || len(v) > 64 {
			return errBadIdentity(v)
		}
	}
	s.engineID, s.epoch = engineID, epoch
	return nil
}

func errBadIdentity(v string) error {
	return fmt.Errorf("%w: engine id or credential epoch %q is not 1 to 64 letters, digits, '.', '_' or '-'", shared.ErrInvalidArgument, v)
}
