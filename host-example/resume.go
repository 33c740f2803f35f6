package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/worker"
)

// Resume: run -tasks F -results DIR -resume keeps each task whose
// DIR/ID/result.json says it succeeded as the same task, and runs the
// rest.
//
// "The same task" is its spec's digest (specDigest), written into
// result.json as spec_sha256 when the task ends: its id, command, env,
// need, timeout and outputs, and each input by name, a file on this
// machine by its content's sha256, another task's output by that task's
// id and the output's path. What does not change what the task does is
// left out: attempts, after (a task after one that runs again runs
// again, below), the line it is on and how the file spells a value
// ("90s" or 90).
//
// A task is kept (resumePlan) when its result.json says succeeded, with
// the spec's digest; every output it lists is under DIR/ID/outputs/
// with the size and sha256 it records; and every task it runs after
// (after, or an input's task) is kept too: a task after one that runs
// again runs again, as Snakemake's rule is. A kept task is not
// submitted; a task after one drops it from its after, and takes each
// of its outputs as an input from DIR/ID/outputs/ on this machine.
// A task that runs again and has a DIR/ID/ from before (one that
// failed, did not end, or changed) has it moved to
// DIR/.earlier/STAMP/ID/ first, so that nothing of the operator's is
// deleted and the new run's files are not mixed with the old ones. A
// task id never starts with '.', so .earlier is no task's directory.
//
// Rejected: a journal of the run beside the results (GNU parallel's
// --joblog). result.json is written whole and atomically before the run
// counts its task ended (writeResult), so it is the journal already, and
// the outputs are checked against it rather than trusted.

// specDigestForm is the form of what specDigest hashes; a change to it
// makes every earlier result a stranger, as it should.
const specDigestForm = 1

// specDigestDoc is what a task's digest is of.
type specDigestDoc struct {
	Form    int               `json:"form"`
	ID      string            `json:"id"`
	Command []string          `json:"command"`
	Env     map[string]string `json:"env,omitempty"`
	CPUs    int               `json:"cpus"`
	GPUs    int               `json:"gpus"`
	RAMMB   int64             `json:"ram_mb"`
	Label   string            `json:"label,omitempty"`
	// Timeout is in nanoseconds.
	Timeout int64            `json:"timeout"`
	Outputs []string         `json:"outputs,omitempty"`
	Inputs  []specDigestItem `json:"inputs,omitempty"`
}

// specDigestItem is one input in a digest: a file by its content's
// sha256, another task's output by its task and path.
type specDigestItem struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256,omitempty"`
	Task   string `json:"task,omitempty"`
	Path   string `json:"path,omitempty"`
}

// fileSums is the sha256 of each input file read so far, by path: a
// file that many tasks take is read once.
type fileSums map[string]string

// sum is the sha256 of the file at p, in hex.
func (s fileSums) sum(p string) (string, error) {
	if v, ok := s[p]; ok {
		return v, nil
	}
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	v := hex.EncodeToString(h.Sum(nil))
	s[p] = v
	return v, nil
}

// specDigest is the digest of what defines spec (see above), reading
// each input file on this machine through sums.
func specDigest(spec engine.TaskSpec, sums fileSums) ([32]byte, error) {
	d := specDigestDoc{
		Form: specDigestForm, ID: spec.ID, Command: spec.Command,
		CPUs: spec.Need.CPUs, GPUs: spec.Need.GPUs, RAMMB: spec.Need.RAMMB, Label: spec.Need.Label,
		Timeout: int64(spec.Timeout),
	}
	if len(spec.Env) > 0 {
		d.Env = spec.Env
	}
	if len(spec.Outputs) > 0 {
		d.Outputs = spec.Outputs
	}
	for _, in := range spec.Inputs {
		it := specDigestItem{Name: in.Name}
		switch {
		case in.FromTask != "":
			it.Task, it.Path = in.FromTask, in.Path
		case in.Data != nil:
			s := sha256.Sum256(in.Data)
			it.SHA256 = hex.EncodeToString(s[:])
		default:
			sum, err := sums.sum(in.Path)
			if err != nil {
				return [32]byte{}, fmt.Errorf("input %q: %w", in.Name, err)
			}
			it.SHA256 = sum
		}
		d.Inputs = append(d.Inputs, it)
	}
	slices.SortFunc(d.Inputs, func(a, b specDigestItem) int { return strings.Compare(a.Name, b.Name) })
	// encoding/json writes a map's keys sorted: the same spec is the
	// same bytes.
	b, err := json.Marshal(d)
	if err != nil {
		return [32]byte{}, err
	}
	return sha256.Sum256(b), nil
}

// specDigests is each task's digest, in the order of specs; an error
// names the file's line (lines[i] is specs[i]'s).
func specDigests(specs []engine.TaskSpec, lines []int, name string) ([][32]byte, error) {
	sums := fileSums{}
	out := make([][32]byte, len(specs))
	for i, s := range specs {
		d, err := specDigest(s, sums)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: task %q: %w", name, lines[i], s.ID, err)
		}
		out[i] = d
	}
	return out, nil
}

// resultFile is result.json: the engine's result for the task and, from
// host-example, the digest of the task it is the result of.
type resultFile struct {
	engine.TaskResult
	// SpecSHA256 is the task's digest (specDigest) in hex; empty for a
	// result written before resume was (never kept).
	SpecSHA256 string `json:"spec_sha256,omitempty"`
}

// maxResultFile bounds a result.json read back: the engine's result
// holds the streams' tails (a few KB each), the outputs' names and the
// attempts.
const maxResultFile = 16 << 20

// keepReason is why a task with an earlier DIR/ID/ runs again, or
// reasonKept.
type keepReason int

const (
	reasonKept keepReason = iota
	// reasonNoResult: no result.json, or one that cannot be read (a run
	// stopped before the task ended).
	reasonNoResult
	// reasonNotSucceeded: it ended otherwise than succeeded.
	reasonNotSucceeded
	// reasonChanged: its spec's digest is not the one its result was
	// for, or its result has none.
	reasonChanged
	// reasonOutputs: an output it brought back is missing or changed.
	reasonOutputs
	// reasonAfter: a task it runs after runs again.
	reasonAfter
	// reasonNew: no earlier DIR/ID/ (nothing to keep, nothing moved).
	reasonNew
)

// keepWords is each reason as the story counts it.
var keepWords = map[keepReason]string{
	reasonNoResult:     "with no result",
	reasonNotSucceeded: "that did not succeed",
	reasonChanged:      "changed",
	reasonOutputs:      "with an output missing or changed",
	reasonAfter:        "after a task that runs again",
	reasonNew:          "new",
}

// keptResult says whether DIR/id/ holds the result of the task whose
// digest is digest, succeeded, with each output it lists as it was
// brought back; else why not, in words.
func keptResult(results *os.Root, id string, digest [32]byte) (keepReason, string) {
	f, err := results.Open(path.Join(id, "result.json"))
	if err != nil {
		return reasonNoResult, "no result.json"
	}
	b, err := io.ReadAll(io.LimitReader(f, maxResultFile+1))
	f.Close()
	var r resultFile
	if err == nil && len(b) > maxResultFile {
		err = fmt.Errorf("larger than %d bytes", maxResultFile)
	}
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	switch {
	case err != nil:
		return reasonNoResult, fmt.Sprintf("its result.json cannot be read: %v", err)
	case r.ID != id:
		return reasonNoResult, fmt.Sprintf("its result.json is task %q's", r.ID)
	case r.State != worker.StateSucceeded:
		return reasonNotSucceeded, fmt.Sprintf("it ended %s", r.State)
	case r.SpecSHA256 == "":
		return reasonChanged, "its result.json says not what task it was (written before -resume was)"
	case r.SpecSHA256 != hex.EncodeToString(digest[:]):
		return reasonChanged, "it changed since (its command, env, need, timeout, inputs or outputs)"
	}
	for _, o := range r.Outputs {
		if why := outputHolds(results, id, o); why != "" {
			return reasonOutputs, fmt.Sprintf("its output %q %s", o.Name, why)
		}
	}
	return reasonKept, ""
}

// outputHolds says how DIR/id/outputs/o.Name is not the file result.json
// says was brought back; "" when it is.
func outputHolds(results *os.Root, id string, o worker.File) string {
	if err := taskRelative(o.Name); err != nil {
		return err.Error()
	}
	name := path.Join(id, "outputs", o.Name)
	fi, err := results.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "is gone"
	case err != nil:
		return fmt.Sprintf("cannot be read: %v", err)
	case !fi.Mode().IsRegular():
		return "is no regular file now"
	case fi.Size() != o.Size:
		return fmt.Sprintf("is %d bytes, %d when it was brought back", fi.Size(), o.Size)
	}
	f, err := results.Open(name)
	if err != nil {
		return fmt.Sprintf("cannot be read: %v", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Sprintf("cannot be read: %v", err)
	}
	if hex.EncodeToString(h.Sum(nil)) != o.SHA256 {
		return "changed since it was brought back (its sha256 differs)"
	}
	return ""
}

// taskDirState says whether results holds a directory for task id with
// something in it (earlier), or none (an empty one counts as none); an
// error for one that cannot be looked in, which is refused as
// resultsFree refuses it.
func taskDirState(results *os.Root, id string) (earlier bool, err error) {
	f, err := results.Open(id)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("task %q: %s: %w; remove it or choose another -results", id, filepath.Join(results.Name(), id), err)
	}
	defer f.Close()
	entries, err := f.ReadDir(1)
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("task %q: %s: %w", id, filepath.Join(results.Name(), id), err)
	}
	return len(entries) > 0, nil
}

// resumePlan is what -resume makes of a tasks file and its results
// directory.
type resumePlan struct {
	// run are the tasks to submit, in the file's order for Submit, with
	// lines and digests beside them; a task after a kept one no longer
	// names it (After), and takes its outputs from DIR/ID/outputs/.
	run     []engine.TaskSpec
	lines   []int
	digests [][32]byte
	// kept counts the tasks kept.
	kept int
	// aside are the tasks to run whose DIR/ID/ holds an earlier
	// attempt, moved aside before the run (moveAside).
	aside []string
	// why is, for each task to run that has an earlier directory or
	// runs after one that runs again, why, in words; reasons counts
	// every task to run by why.
	why     map[string]string
	reasons map[keepReason]int
}

// planResume decides, for specs in an order where each comes after
// those it runs after (as readTaskLines returns them), which are kept
// from results and which run (see the top of this file).
func planResume(results *os.Root, specs []engine.TaskSpec, lines []int, digests [][32]byte) (*resumePlan, error) {
	p := &resumePlan{why: map[string]string{}, reasons: map[keepReason]int{}}
	kept := map[string]bool{}
	var errs []error
	for i, s := range specs {
		earlier, err := taskDirState(results, s.ID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		reason, why := reasonNew, ""
		if earlier {
			reason, why = keptResult(results, s.ID, digests[i])
		}
		if reason == reasonKept {
			for _, dep := range runsAfter(s) {
				if !kept[dep] {
					reason, why = reasonAfter, fmt.Sprintf("it runs after task %s, which runs again", dep)
					break
				}
			}
		}
		if reason == reasonKept {
			kept[s.ID] = true
			p.kept++
			continue
		}
		if reason != reasonNew {
			p.why[s.ID] = why
		}
		p.reasons[reason]++
		if earlier {
			p.aside = append(p.aside, s.ID)
		}
		p.run = append(p.run, s)
		p.lines = append(p.lines, lines[i])
		p.digests = append(p.digests, digests[i])
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	base, err := filepath.Abs(results.Name())
	if err != nil {
		return nil, err
	}
	for i, s := range p.run {
		p.run[i] = afterKept(s, kept, base)
	}
	return p, nil
}

// runsAfter is the tasks spec runs after: its After and its inputs'
// tasks.
func runsAfter(spec engine.TaskSpec) []string {
	deps := slices.Clone(spec.After)
	for _, in := range spec.Inputs {
		if in.FromTask != "" {
			deps = append(deps, in.FromTask)
		}
	}
	return deps
}

// afterKept is spec with the tasks it runs after that are kept taken
// out: gone from After, and each input from one's outputs a file on
// this machine under base (the results directory), DIR/ID/outputs/PATH,
// which Submit reads as any input.
func afterKept(spec engine.TaskSpec, kept map[string]bool, base string) engine.TaskSpec {
	if !slices.ContainsFunc(runsAfter(spec), func(id string) bool { return kept[id] }) {
		return spec
	}
	spec.After = slices.DeleteFunc(slices.Clone(spec.After), func(id string) bool { return kept[id] })
	inputs := slices.Clone(spec.Inputs)
	for i, in := range inputs {
		if in.FromTask != "" && kept[in.FromTask] {
			inputs[i] = engine.Input{Name: in.Name, Path: filepath.Join(base, in.FromTask, "outputs", filepath.FromSlash(in.Path))}
		}
	}
	spec.Inputs = inputs
	return spec
}

// earlierDir is where -resume moves the task directories of tasks that
// run again, under -results: .earlier/STAMP/ID/, STAMP the run's start.
const earlierDir = ".earlier"

// moveAside moves each task's directory under results to
// .earlier/STAMP/ID/ (STAMP now, made unique), and returns that
// directory's path; nothing is deleted.
func moveAside(results *os.Root, ids []string, now time.Time) (string, error) {
	if len(ids) == 0 {
		return "", nil
	}
	if err := results.Mkdir(earlierDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("-resume: %s: %w", filepath.Join(results.Name(), earlierDir), err)
	}
	stamp := now.Format("20060102-150405")
	dir := path.Join(earlierDir, stamp)
	for n := 2; ; n++ {
		err := results.Mkdir(dir, 0o700)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("-resume: %s: %w", filepath.Join(results.Name(), dir), err)
		}
		dir = path.Join(earlierDir, fmt.Sprintf("%s-%d", stamp, n))
	}
	for _, id := range ids {
		if err := results.Rename(id, path.Join(dir, id)); err != nil {
			return "", fmt.Errorf("-resume: moving %s aside to %s: %w", filepath.Join(results.Name(), id), filepath.Join(results.Name(), dir), err)
		}
	}
	return filepath.Join(results.Name(), filepath.FromSlash(dir)), nil
}

// resumeLine is the story's line for a plan: how many kept, how many
// run and why, counted.
func (p *resumePlan) resumeLine() string {
	line := fmt.Sprintf("resume: %d task(s) kept from an earlier run (succeeded, unchanged), %d to run", p.kept, len(p.run))
	var parts []string
	for _, r := range []keepReason{reasonNew, reasonNoResult, reasonNotSucceeded, reasonChanged, reasonOutputs, reasonAfter} {
		if n := p.reasons[r]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, keepWords[r]))
		}
	}
	if len(parts) > 0 {
		line += " (" + strings.Join(parts, ", ") + ")"
	}
	return line
}
