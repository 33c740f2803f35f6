package queue

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fluksio/provision/internal/clip"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/sbatch"
)

// Submitting and cancelling.

// maxDetail is how much of what a command printed an error carries:
// enough for Slurm's two-line rejections, not a page of a login banner.
const maxDetail = 500

// truncate keeps the ends of s within maxDetail.
func truncate(s string) string { return clip.Ends(s, maxDetail) }

// WithStderr adds what a failed command printed to its error, trimmed.
func WithStderr(err error, stderr []byte) error {
	if err != nil && len(bytes.TrimSpace(stderr)) > 0 {
		return fmt.Errorf("%w: %s", err, truncate(string(stderr)))
	}
	return err
}

// CommandError is a command that failed, or may not have run at all,
// with what it printed: the caller decides from it whether the job may
// exist all the same (an answer lost) and what to report.
type CommandError struct {
	Stdout, Stderr []byte
	// Err is the run's own error: the transport's, a deadline, an exit
	// status, the budget's wait.
	Err error
}

func (e *CommandError) Error() string { return WithStderr(e.Err, e.Stderr).Error() }

// Unwrap gives errors.Is and errors.As the run's own error.
func (e *CommandError) Unwrap() error { return e.Err }

// Submit submits script with sbatch --parsable and opts on its command
// line, which win over the script's own #SBATCH lines, and returns the
// job's id. A run that failed is a *CommandError; a run that printed no
// job id an error that says what it printed.
func (q *Queue) Submit(ctx context.Context, script []byte, opts ...string) (string, error) {
	stdout, stderr, err := q.Run(ctx, script, append([]string{"sbatch", "--parsable"}, opts...)...)
	if err != nil {
		return "", &CommandError{Stdout: stdout, Stderr: stderr, Err: err}
	}
	return ParseJobID(string(stdout))
}

// TestOnly asks sbatch --test-only whether script would be accepted, and
// when it would start, without submitting it: sbatch says so on stderr
// either way.
func (q *Queue) TestOnly(ctx context.Context, script []byte) (stdout, stderr []byte, err error) {
	return q.Run(ctx, script, "sbatch", "--test-only")
}

// ParseJobID reads the job id from what sbatch --parsable printed: the
// id, or "id;cluster" with --clusters. Only the last non-empty line
// counts, since a login shell may print a banner first and Slurm has
// printed warnings before the id.
func ParseJobID(stdout string) (string, error) {
	var last string
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			last = l
		}
	}
	id, _, _ := strings.Cut(last, ";")
	if !sbatch.IsJobID(id) {
		return "", fmt.Errorf("sbatch printed %q, not a job id", truncate(strings.TrimSpace(stdout)))
	}
	return id, nil
}

// cancelBatch is the most ids one scancel is given. The command line and
// slurmctld both cope with more, but one call with thousands of ids is
// what times out at shutdown on busy clusters.
const cancelBatch = 100

// Cancel cancels jobs with one call per cancelBatch ids: one ssh
// connection however many there are, within reason. scancel is silent
// about jobs that have already ended, so cancelling one twice is
// harmless. (scancel --name cannot stand in: it takes the name
// literally, and would cancel workers that have attached.) An id that is
// not a job's refuses them all, before anything runs.
func (q *Queue) Cancel(ctx context.Context, ids []string) error {
	for _, id := range ids {
		if !sbatch.IsJobRef(id) {
			return fmt.Errorf("refusing to cancel %q: not a job id: %w", id, shared.ErrInvalidArgument)
		}
	}
	var errs []error
	// An array's tasks go as ranges ("123_[5-9]"): a burst given up is
	// a short command line.
	for batch := range slices.Chunk(sbatch.CompactIDs(ids), cancelBatch) {
		_, stderr, err := q.Run(ctx, nil, append([]string{"scancel"}, batch...)...)
		if err = WithStderr(err, stderr); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
