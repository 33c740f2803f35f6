package slurm

// The worker ships itself: unless worker_command is set, the plugin puts
// the fluksio-worker built with it on the login node, as it puts its own
// binary there for the relay (relay.go), and each job checks that copy by
// its sha256 before it runs it.
//
// Which binary: fluksio-worker-<GOOS>-<GOARCH> beside the plugin's own
// executable for the login node's kind (uname -sm over ssh), else
// fluksio-worker there when the login node is of the plugin host's own
// kind (make build puts both programs in bin/, the worker static).
//
// Where: ~/.local/share/fluksio/bin/fluksio-worker-<first 16 hex digits
// of its sha256> in the login user's home, the directory and the file
// 0700. It is copied once per version: a submission checks the copy, at
// most every workerRecheck and again after any job ended before its
// worker attached, and copies it only when it is missing or does not
// match. Copies of other versions unused for an hour are removed, and
// only files of this naming in this directory (staleCopiesScript).
//
// The compute nodes run the copy from there, so they must see the login
// user's home directory, as they do on most sites; where they do not,
// worker_command names a worker installed where they do, and nothing is
// shipped.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"time"
	"unicode"

	"github.com/fluksio/provision/internal/fileperm"
	"github.com/fluksio/provision/slurm/internal/queue"
)

const (
	// workerShipDir is where, under the login user's home, the plugin
	// keeps the worker it ships.
	workerShipDir = ".local/share/fluksio/bin"
	// workerProgram is the worker's program name, beside the plugin and
	// on the login node.
	workerProgram = "fluksio-worker"

	// exitWorkerMismatch is a job's exit code when its copy of the worker
	// is missing or does not match the sha256 its script carries.
	exitWorkerMismatch = 92

	// workerRecheck is how long a check of the copy holds: the next
	// submission after it checks again, which also marks the copy used,
	// so that another version's plugin sharing the account does not take
	// it for stale (staleCopiesScript).
	workerRecheck = 30 * time.Minute
)

// Placeholders for a preview, which runs nothing on the login node.
const (
	workerPathPlaceholder = "LOGIN-HOME/" + workerShipDir + "/" + workerProgram + "-VERSION"
	workerSumPlaceholder  = "WORKER-SHA256"
)

// workerCopy is the worker's copy on the login node: its absolute path
// there and its sha256 in hex. The zero value is no copy checked yet.
type workerCopy struct {
	path, sum string
}

// workerFile is the shipped worker's name: the version is its sha256.
func workerFile(sum string) string { return workerProgram + "-" + sum[:16] }

// workerGlob matches the shipped workers' names, and nothing else of
// the directory.
var workerGlob = workerProgram + "-" + strings.Repeat("[0-9a-f]", 16)

// loginScript prints the login node's uname -sm and the login user's
// home, one a line.
const loginScript = `uname -sm; printf '%s\n' "$HOME"`

// workerMatchScript exits 0 when the copy of version sum is in place and
// whole, exitNoBinary when it is missing or another file. It changes
// nothing (validate -check runs it).
func workerMatchScript(sum string) string {
	return fmt.Sprintf(`d="$HOME/%s"; f="$d/%s"; printf '%%s  %%s\n' %s "$f" | sha256sum -c --status 2>/dev/null || exit %d; `,
		workerShipDir, workerFile(sum), sum, exitNoBinary)
}

// workerKeepScript marks the copy in $f used and removes other versions'
// copies unused for an hour from $d, and uploads cut short that long
// ago.
func workerKeepScript(sum string) string {
	return `touch "$f"; ` + staleCopiesScript("d", workerGlob, workerFile(sum)) + staleCopiesScript("d", ".upload.*", workerFile(sum)) + "exit 0"
}

// workerCheckScript is workerMatchScript, then, when the copy matches,
// workerKeepScript.
func workerCheckScript(sum string) string {
	return workerMatchScript(sum) + workerKeepScript(sum)
}

// workerUploadScript copies standard input to the copy of version sum
// (uploadScript), then runs workerKeepScript.
func workerUploadScript(sum string) string {
	return uploadScript(workerShipDir, workerFile(sum), sum) + fmt.Sprintf(` || exit 1; f="$d/%s"; `, workerFile(sum)) + workerKeepScript(sum)
}

// workerGuard is the job script's line before it runs the copy: the copy
// must match its sha256, or the job says so in its output and exits
// exitWorkerMismatch without running it. A copy replaced after the
// plugin checked it (by the account itself, or another version's
// plugin) is refused by its job, and the plugin, hearing the job ended
// before its worker attached, checks and copies it again before its
// next submission.
func workerGuard(c workerCopy) string {
	q := shellQuote(c.path)
	return fmt.Sprintf(`printf '%%s  %%s\n' %s %s | sha256sum -c --status || { printf 'fluksio: the worker %%s does not match its sha256 %%s (missing, or replaced since the plugin copied it); not running it\n' %s %s >&2; exit %d; }`,
		shellQuote(c.sum), q, q, shellQuote(c.sum), exitWorkerMismatch)
}

// workerBinary is the worker to ship to a login node whose uname -sm is
// platform, from dir: fluksio-worker-<GOOS>-<GOARCH>, or fluksio-worker
// when the login node is of the plugin host's own kind.
func workerBinary(dir, platform string) (string, error) {
	goos, goarch, ok := goPlatform(platform)
	if !ok {
		return "", fmt.Errorf("the login node says it is %q (uname -sm), a kind this plugin knows no Go build for; install a worker built for it where the compute nodes see it and set worker_command", strings.TrimSpace(platform))
	}
	tried := []string{filepath.Join(dir, workerProgram+"-"+goos+"-"+goarch)}
	if goos == runtime.GOOS && goarch == runtime.GOARCH {
		tried = append(tried, filepath.Join(dir, workerProgram))
	}
	for _, p := range tried {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("no worker to ship to the login node (%s): looked for %s; build it beside the plugin (CGO_ENABLED=0 GOOS=%s GOARCH=%s go build -o %s ./worker/fluksio-worker), or install a worker where the compute nodes see it and set worker_command",
		strings.TrimSpace(platform), strings.Join(tried, " and "), goos, goarch, tried[0])
}

// sha256Hex is data's sha256 in hex, as sha256sum prints it.
func sha256Hex(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

// shipPlan is what a check of the login node found: the worker binary to
// ship there, its bytes and sha256, and where its copy goes.
type shipPlan struct {
	local string
	data  []byte
	copy  workerCopy
}

// shippedWorker is validate -check's word on the shipped worker: where
// its copy is or will be, and that the compute nodes must see it. It
// copies nothing; the scratch provisioner's scripts name the copy.
func (c *check) shippedWorker(ctx context.Context) {
	plan, err := c.q.files.planShip(ctx, c.cfg)
	if err != nil {
		c.fail([]string{"worker_command"}, "No worker to ship", "worker_command is unset, so the plugin ships its own worker to the login node, and cannot: %v.", err)
		return
	}
	state := "copied there at the first submission"
	_, _, err = c.q.q.Run(ctx, nil, "sh", "-c", workerMatchScript(plan.copy.sum))
	if err == nil {
		state = "already there"
	}
	c.q.mu.Lock()
	c.q.files.shipped = plan.copy
	c.q.mu.Unlock()
	c.fact("worker", fmt.Sprintf("shipped by the plugin: %s (sha256 %s…, %d bytes) to %s on the login node, %s. Jobs run it from there, so the compute nodes must see the login user's home directory; where they do not, install a worker where they do and set worker_command",
		plan.local, plan.copy.sum[:16], len(plan.data), plan.copy.path, state), "worker_command")
}

// loginFiles is what the provisioner keeps on the login node: the
// worker's copy it ships (this file) and log_dir, where jobs write their
// output and explain reads it back (joblog.go).
type loginFiles struct {
	// p is the provisioner whose books this reads and changes, under p.mu.
	p *Provisioner

	// makingLogDir holds one token while log_dir is being made, so that
	// a burst of first submissions makes it once, not once each; it is
	// taken with the caller's context, across that one ssh call.
	makingLogDir chan struct{}
	// shipping holds one token while the worker's copy on the login node
	// is checked or copied (ship.go), so that a burst of submissions
	// copies it once; taken with the caller's context, across those ssh
	// calls.
	shipping chan struct{}
	// workerDir is where the worker binaries to ship are looked for
	// (ship.go); empty means the directory of the plugin's own
	// executable. Tests set it before Configure; it never changes after.
	workerDir string
	// lookOnly is set for a check's provisioner (scratch): log_dir's logs
	// are counted, never pruned. It never changes after.
	lookOnly bool

	// The fields below are guarded by p.mu.

	// logDirAbs is log_dir as the login node resolved it, empty until
	// the first submission made it (joblog.go).
	logDirAbs string
	// shipped is the worker's copy on the login node when worker_command
	// is unset, zero until a submission has checked it (ship.go), and
	// shippedAt when it was last checked; a zero shippedAt has the next
	// submission check it again.
	shipped   workerCopy
	shippedAt time.Time
}

// binDir is where the worker binaries to ship are looked for.
func (lf *loginFiles) binDir() (string, error) {
	if lf.workerDir != "" {
		return lf.workerDir, nil
	}
	bin, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding the plugin's own executable, beside which the worker to ship is: %w", err)
	}
	return filepath.Dir(bin), nil
}

// planShip asks the login node its kind and home and reads the worker to
// ship to it. It changes nothing.
func (lf *loginFiles) planShip(ctx context.Context, cfg *settings) (shipPlan, error) {
	p := lf.p
	stdout, stderr, err := p.q.Run(ctx, nil, "sh", "-c", loginScript)
	if err != nil {
		return shipPlan{}, fmt.Errorf("asking %s its kind and home, to ship the worker: %w", cfg.host(), queue.WithStderr(err, stderr))
	}
	// A login shell's start-up files may print first: the answer is the
	// last two lines.
	lines := strings.Split(strings.TrimRight(string(stdout), "\n"), "\n")
	if len(lines) < 2 {
		return shipPlan{}, fmt.Errorf("asking %s its kind and home, to ship the worker: it printed %q", cfg.host(), truncate(string(stdout)))
	}
	platform, home := strings.TrimSpace(lines[len(lines)-2]), lines[len(lines)-1]
	if !path.IsAbs(home) || strings.ContainsFunc(home, unicode.IsControl) {
		return shipPlan{}, fmt.Errorf("the login user's home on %s is %q, which is not an absolute path the worker can be shipped under; set worker_command", cfg.host(), truncate(home))
	}
	dir, err := lf.binDir()
	if err != nil {
		return shipPlan{}, err
	}
	local, err := workerBinary(dir, platform)
	if err != nil {
		return shipPlan{}, err
	}
	if pr := fileperm.Check(local); pr != nil {
		return shipPlan{}, fmt.Errorf("the worker to ship, %s, can be changed by others: %s; fix: %s", local, pr.Why, pr.Fix)
	}
	data, err := os.ReadFile(local)
	if err != nil {
		return shipPlan{}, fmt.Errorf("reading the worker to ship: %w", err)
	}
	sum := sha256Hex(data)
	return shipPlan{local: local, data: data, copy: workerCopy{path: path.Join(home, workerShipDir, workerFile(sum)), sum: sum}}, nil
}

// ensureWorker returns the worker's copy on the login node, checked
// within workerRecheck, copying it there first when it is missing or
// does not match; the zero workerCopy when worker_command is set, and
// nothing is shipped.
func (lf *loginFiles) ensureWorker(ctx context.Context, cfg *settings) (workerCopy, error) {
	p := lf.p
	if cfg.WorkerCommand != nil {
		return workerCopy{}, nil
	}
	checked := func() (workerCopy, bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return lf.shipped, lf.shipped.path != "" && !lf.shippedAt.IsZero() && p.now().Sub(lf.shippedAt) < workerRecheck
	}
	if c, ok := checked(); ok {
		return c, nil
	}
	select {
	case lf.shipping <- struct{}{}:
		defer func() { <-lf.shipping }()
	case <-ctx.Done():
		return workerCopy{}, fmt.Errorf("waiting for the worker to be shipped: %w", ctx.Err())
	}
	// Checked while this call waited for its turn.
	if c, ok := checked(); ok {
		return c, nil
	}
	plan, err := lf.planShip(ctx, cfg)
	if err != nil {
		return workerCopy{}, err
	}
	_, stderr, err := p.q.Run(ctx, nil, "sh", "-c", workerCheckScript(plan.copy.sum))
	var ee *exec.ExitError
	switch {
	case err == nil:
		cfg.log.Debug("the worker's copy on the login node checks out", "path", plan.copy.path)
	case errors.As(err, &ee) && ee.ExitCode() == exitNoBinary:
		cfg.log.Info("copying the worker to the login node", "from", plan.local, "path", plan.copy.path, "bytes", len(plan.data))
		// Megabytes: more than submit_timeout may allow over a slow
		// link, and it happens once per version.
		if _, stderr, err := p.q.Transport().RunWithin(ctx, max(cfg.submitTimeout, relayUploadTimeout), plan.data, "sh", "-c", workerUploadScript(plan.copy.sum)); err != nil {
			return workerCopy{}, fmt.Errorf("copying the worker to %s: %w", cfg.host(), queue.WithStderr(err, stderr))
		}
	default:
		return workerCopy{}, fmt.Errorf("checking the worker's copy on %s: %w", cfg.host(), queue.WithStderr(err, stderr))
	}
	p.mu.Lock()
	lf.shipped, lf.shippedAt = plan.copy, p.now()
	p.mu.Unlock()
	return plan.copy, nil
}

// recheckWorkerLocked has the next submission check the worker's copy
// again: a job ended before its worker attached, and a missing or
// replaced copy is one reason it may have. p.mu must be held.
func (lf *loginFiles) recheckWorkerLocked() {
	lf.shippedAt = time.Time{}
}

// workerCopyFor is the copy a script runs: the one checked, or
// placeholders in a preview, which checks nothing.
func (lf *loginFiles) workerCopyFor() workerCopy {
	p := lf.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if lf.shipped.path != "" {
		return lf.shipped
	}
	return workerCopy{path: workerPathPlaceholder, sum: workerSumPlaceholder}
}
