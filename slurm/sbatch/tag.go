package sbatch

import (
	"strings"

	"github.com/fluksio/provision/shared"
)

// TagPrefix starts the tag in the comment of every job the provisioner
// submits:
//
//	fluksio:v2:<engine id>:<credential epoch>:<worker>
//
// The tag decides whose job it is; why a tag and not the job's name:
// docs/design/slurm-tags.md.
const TagPrefix = "fluksio:v2:"

// Tag is a parsed job tag: the engine that submitted the job, the engine's
// credential epoch then, and the job's worker.
type Tag struct {
	Engine, Epoch, Worker string
}

// Comment is the tag as a job's comment.
func (t Tag) Comment() string {
	return TagPrefix + t.Engine + ":" + t.Epoch + ":" + t.Worker
}

// ParseTag reads a job comment. ok is false for anything that is not a
// v2 tag with three valid names: none of its parts may contain ':', since
// shared.ValidName excludes it.
func ParseTag(comment string) (t Tag, ok bool) {
	rest, ok := strings.CutPrefix(comment, TagPrefix)
	if !ok {
		return Tag{}, false
	}
	parts := strings.Split(rest, ":")
	if len(parts) != 3 {
		return Tag{}, false
	}
	for _, p := range parts {
		if !shared.ValidName(p) {
			return Tag{}, false
		}
	}
	return Tag{Engine: parts[0], Epoch: parts[1], Worker: parts[2]}, true
}
