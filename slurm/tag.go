package slurm

import (
	"fmt"
	"strings"

	"github.com/fluksio/provision/shared"
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
// Rejected alternative: the job name alone (the first version). Names
// are what people copy, and the tag had to be in a form nobody writes by
// accident. Its cost: jobs left by a version that wrote the v1 comment
// (fluksio:<worker>) are no longer recognised; their --deadline or their
// worker's max_idle ends them.
const tagPrefix = "fluksio:v2:"

// jobTag is a parsed tag.
type jobTag struct {
	engine, epoch, worker string
}

// jobComment is the comment that tags worker's job for this engine.
func jobComment(engine, epoch, worker string) string {
	return tagPrefix + engine + ":" + epoch + ":" + worker
}

// comment is the tag of worker's job under these settings.
func (s *settings) comment(worker string) string {
	return jobComment(s.engineID, s.epoch, worker)
}

// parseTag reads a job comment. ok is false for anything that is not a
// v2 tag with three valid names: none of its parts may contain ':', since
// shared.ValidName excludes it.
func parseTag(comment string) (t jobTag, ok bool) {
	rest, ok := strings.CutPrefix(comment, tagPrefix)
	if !ok {
		return jobTag{}, false
	}
	parts := strings.Split(rest, ":")
	if len(parts) != 3 {
		return jobTag{}, false
	}
	for _, p := range parts {
		if !shared.ValidName(p) {
			return jobTag{}, false
		}
	}
	return jobTag{engine: parts[0], epoch: parts[1], worker: parts[2]}, true
}

// ours reports whether a job with this comment belongs to this engine.
func (s *settings) ours(comment string) (jobTag, bool) {
	t, ok := parseTag(comment)
	return t, ok && t.engine == s.engineID
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
