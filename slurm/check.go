package slurm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
	"github.com/fluksio/provision/slurm/sbatch"
)

// The preflight (shared.Checker) and the preview (shared.Previewer).
//
// Everything that depends on the cluster used to be found at run time
// and then retried: a wrong partition, a time limit beyond the
// partition's, a key file that is not there, a worker that is not
// installed. Check asks the cluster itself, before the first request,
// over the very ssh settings a run uses, and answers in its words at the
// configuration's line. It is read-only: sbatch --test-only accepts or
// refuses a script without queueing it, and nothing else it runs changes
// anything. It runs in a provisioner of its own, never configured, so no
// poller, relay or adoption starts, and its ssh ControlMaster is stopped
// before it returns.
//
// What it does not check: whether compute nodes can reach the engine
// (only a job could tell, and a check submits none), and whether the
// worker exists on the compute nodes rather than the login node (the
// usual shared filesystem makes them the same; prerun lines, which may
// put it on PATH there, are not run). With worker_command unset it says
// where the plugin's copy of the worker is or will be, and copies
// nothing.

// credentialPlaceholder stands where a worker's credential goes in a
// previewed or test-only script: none is minted for a script that is not
// submitted.
const credentialPlaceholder = "<credential: minted by the engine for each worker when it is submitted>"

// relayURLPlaceholder stands for the relay's address in a preview: it is
// known only once the relay runs on the login node; relayPinPlaceholder
// for its certificate's SHA-256, made when the plugin is configured.
const (
	relayURLPlaceholder = "https://RELAY-HOST:RELAY-PORT"
	relayPinPlaceholder = "RELAY-CERT-SHA256"
)

// checkTimeout bounds a whole check when the caller's context does not:
// a login, scontrol, one command lookup and one sbatch --test-only per
// profile, each also bounded by submit_timeout.
const checkTimeout = 2 * time.Minute

// Check checks a configuration against the cluster it names.
func (p *Provisioner) Check(ctx context.Context, req *shared.CheckRequest) (*shared.CheckResponse, error) {
	if req == nil {
		return nil, shared.ErrInvalidArgument
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, checkTimeout)
		defer cancel()
	}
	// A check waits for Slurm as long as it may take in all (the
	// caller's -check-timeout), not a run's submit_timeout: a controller
	// that rations RPCs, its bucket kept empty by this user's other
	// clients, answers a check late that a run would simply poll again.
	deadline, _ := ctx.Deadline()
	q, diags := p.scratch(ctx, req.Name, req.Config, req.EngineID, time.Until(deadline))
	if diags.HasErrors() {
		return &shared.CheckResponse{Diagnostics: diags}, nil
	}
	defer q.stop()
	defer q.q.Close(context.WithoutCancel(ctx))
	c := &check{q: q, cfg: q.settings(), resp: &shared.CheckResponse{Diagnostics: diags}, index: profileIndex(req.Config)}
	if c.login(ctx) {
		c.cluster(ctx)
		c.limits(ctx)
		c.worker(ctx)
		c.logs(ctx)
		c.profiles(ctx)
		if req.Probe {
			c.probe(ctx)
		}
	}
	return c.resp, nil
}

// Preview returns the batch script a profile would submit.
func (p *Provisioner) Preview(ctx context.Context, req *shared.PreviewRequest) (*shared.PreviewResponse, error) {
	if req == nil {
		return nil, shared.ErrInvalidArgument
	}
	q, diags := p.scratch(ctx, req.Name, req.Config, "", 0)
	if diags.HasErrors() {
		return &shared.PreviewResponse{Diagnostics: diags}, nil
	}
	defer q.stop()
	cfg := q.settings()
	prof, ok := cfg.profile(req.Profile)
	if !ok {
		names := make([]string, len(cfg.Profiles))
		for i, pr := range cfg.Profiles {
			names[i] = pr.Name
		}
		return &shared.PreviewResponse{Diagnostics: append(diags, shared.Errorf(nil, "No such profile",
			"This provisioner has no profile %q; it has %s.", req.Profile, strings.Join(names, ", ")))}, nil
	}
	return &shared.PreviewResponse{Diagnostics: diags, Text: string(q.previewScript(prof))}, nil
}

// scratch is a provisioner for one check or preview: the configuration
// parsed and validated as Configure would, held by a Provisioner of its
// own that is never configured, so nothing starts. Each of its commands
// may take wait, where that is longer than submit_timeout.
func (p *Provisioner) scratch(ctx context.Context, name string, raw json.RawMessage, engineID string, wait time.Duration) (*Provisioner, shared.Diagnostics) {
	cfg, diags := parseConfig(name, raw)
	if !diags.HasErrors() {
		diags = append(diags, checkEffectiveSSH(ctx, p.sshPath, cfg)...)
	}
	if diags.HasErrors() {
		return nil, diags
	}
	cfg.log = p.logger.With("provisioner", cfg.name, "check", true)
	if err := cfg.identity(engineID, ""); err != nil {
		return nil, append(diags, shared.Errorf(nil, "Invalid engine id", "%v.", err))
	}
	q := New(p.logger)
	q.sshPath, q.now = p.sshPath, p.now
	q.files.lookOnly = true
	cfg.checkWait = wait
	q.cfg = cfg
	q.q = q.newQueue(cfg, q.newTransport(cfg))
	return q, diags
}

// previewScript is the script a single machine of prof would be submitted
// with, credentials as placeholders.
func (p *Provisioner) previewScript(prof Profile) []byte {
	cfg := p.settings()
	url, pin := cfg.EngineURL, ""
	if cfg.Reach == reachRelay {
		url = relayURLPlaceholder
		if cfg.relayServesTLS() {
			pin = relayPinPlaceholder
		}
	}
	tokens := make([]string, max(1, prof.Nodes))
	for i := range tokens {
		tokens[i] = credentialPlaceholder
	}
	return p.sub.script(prof, url, pin, workerName(cfg.name, prof.Name), nil, [][]string{tokens})
}

// profileIndex maps each profile's name to its place in the
// configuration as written, which diagnostics' paths use; settings hold
// the profiles in match order.
func profileIndex(raw json.RawMessage) map[string]int {
	c, _ := decodeConfig(raw)
	idx := map[string]int{}
	if c != nil {
		for i, pr := range c.Profiles {
			idx[pr.Name] = i
		}
	}
	return idx
}

// check is one preflight under way.
type check struct {
	q     *Provisioner
	cfg   *settings
	resp  *shared.CheckResponse
	index map[string]int
	// clusterName is ClusterName from scontrol show config, "" if unread:
	// the user's associations of other clusters are not its limits.
	clusterName string
}

func (c *check) fact(name, value string, path ...string) {
	c.resp.Facts = append(c.resp.Facts, shared.Fact{Name: name, Value: value, Path: path})
}

func (c *check) fail(path []string, summary, format string, args ...any) {
	c.resp.Diagnostics = append(c.resp.Diagnostics, shared.Errorf(path, summary, format, args...))
}

// login runs one command over the configured ssh settings, on every
// login of a list, not only the first that answers: the provisioner would
// skip a broken one in silence until the others fail too, which is the
// moment an operator least wants to learn of it. With one login, its
// failure ends the check, and ssh's words say which setting is wrong;
// with several, each that fails is a warning and one that answers is
// enough to go on.
func (c *check) login(ctx context.Context) bool {
	logins := c.cfg.loginList()
	remote := []string{"sh", "-c", `echo "$(id -un)@$(hostname)"`}
	answered := 0
	var firstSaid string
	for i := range logins {
		entry := c.cfg.Login.Entries[i]
		name := "login"
		if len(logins) > 1 {
			name = fmt.Sprintf("login %d of %d", i+1, len(logins))
		}
		stdout, stderr, err := c.q.q.Transport().RunOn(ctx, i, nil, remote...)
		if err == nil {
			answered++
			// The path taken: direct, or through the bastion that
			// answered.
			via := ""
			if b, ok := c.q.q.Transport().BastionInUse(); ok {
				via = " via bastion " + b.String()
			}
			c.fact(name, fmt.Sprintf("ok, as %s (ssh %s%s)", strings.TrimSpace(lastLine(stdout)), entry, via))
			continue
		}
		said := strings.TrimSpace(string(stderr))
		if said == "" {
			said = err.Error()
		}
		said = truncate(said)
		path, summary, fix := sshBlame(c.cfg, said)
		if len(logins) == 1 {
			c.fail(path, summary, "ssh to %s failed: %s. %s", entry, quoteLines(said), fix)
			return false
		}
		if firstSaid == "" {
			firstSaid = said
		}
		c.fact(name, fmt.Sprintf("failed (ssh %s): %s", entry, said))
		c.resp.Diagnostics = append(c.resp.Diagnostics, shared.Diagnostic{Severity: shared.SeverityWarning, Path: []string{"login"},
			Summary: fmt.Sprintf("%s (%s)", summary, name),
			Detail: fmt.Sprintf("ssh to %s failed: %s. The provisioner skips it while it does not answer and goes through the others; %s Or take it out of login.",
				entry, quoteLines(said), fix)})
	}
	if answered == 0 {
		path, summary, fix := sshBlame(c.cfg, firstSaid)
		c.fail(path, summary, "ssh to every login (%s) failed; the first said: %s. %s", c.cfg.Login, quoteLines(firstSaid), fix)
		return false
	}
	return true
}

// waited is how long a command of the check could wait: the check's
// whole time where it has one, else submit_timeout.
func (c *check) waited() time.Duration {
	if c.cfg.checkWait > 0 {
		return c.cfg.checkWait
	}
	return c.cfg.submitTimeout
}

// logs says what log_dir holds: how many job logs and their bytes,
// against what it keeps. It changes nothing; a failure to look is a
// fact, not a diagnostic, since the first submission makes log_dir.
func (c *check) logs(ctx context.Context) {
	stdout, stderr, err := c.q.q.Run(ctx, nil, "sh", "-c", lookLogsScript, "sh", c.cfg.logDir(), "look")
	keeps := fmt.Sprintf("keeps the newest %d, %d MiB at most (log_dir_keep)", c.cfg.logKeep(), logKeepBytes>>20)
	out := string(stdout)
	lc, ok := readLogCount(out)
	switch {
	case err != nil:
		c.fact("log_dir", fmt.Sprintf("%s: not looked at (%s)", c.cfg.logDir(), truncate(queue.WithStderr(err, stderr).Error())), "log_dir")
	case strings.Contains(out, "fluksio-nodir"):
		c.fact("log_dir", fmt.Sprintf("%s: not made yet (the first submission makes it); %s", c.cfg.logDir(), keeps), "log_dir")
	case ok:
		c.fact("log_dir", fmt.Sprintf("%s: %d job log(s), %s; %s", strings.TrimSpace(lastLine(stdout)), lc.found, byteSize(lc.foundBytes), keeps), "log_dir")
	}
}

// byteSize is n bytes for a person: 512 B, 3.4 KiB, 12.0 MiB.
func byteSize(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
}

// sshBlame says which setting an ssh failure is about, and what to do.
func sshBlame(cfg *settings, said string) (path []string, summary, fix string) {
	s := strings.ToLower(said)
	keyPath := []string{"ssh_key"}
	if cfg.SSHKey == "" {
		keyPath = []string{"login"}
	}
	hostPath := []string{"known_hosts"}
	if cfg.KnownHosts == "" {
		hostPath = []string{"login"}
	}
	switch {
	case strings.Contains(s, "identity file") && strings.Contains(s, "not accessible"),
		strings.Contains(s, "no such identity"):
		return keyPath, "ssh key not found", "Check that ssh_key names an existing private key file readable by the engine's user."
	case strings.Contains(s, "load key") || strings.Contains(s, "bad permissions") || strings.Contains(s, "invalid format"):
		return keyPath, "ssh key unusable", "Check that ssh_key is a private key without a passphrase, readable by the engine's user only (chmod 600)."
	case strings.Contains(s, "host key verification failed") || strings.Contains(s, "host identification has changed") ||
		strings.Contains(s, "no ") && strings.Contains(s, "host key is known"):
		if len(cfg.bastions) > 0 {
			return hostPath, "Host key not trusted", "ssh names the host whose key it does not trust: the bastion's or the login node's. Add it to known_hosts, which with bastion set holds both (ssh-keyscan -p PORT HOST, checked against the site's published fingerprints)."
		}
		return hostPath, "Login node's host key not trusted", "Add the login node's host key to known_hosts (ssh-keyscan, checked against the site's published fingerprint)."
	case strings.Contains(s, "permission denied") && !cfg.multiplex:
		return []string{"login"}, "Login refused", "Where the plugin runs through an operator's ssh master (multiplex = false, ssh_config's ControlPath, the MFA recipe), the master is not open: run `" +
			masterCommand(cfg) + "` as the engine's user and answer its prompts. Otherwise check ssh_key and that its public half is in the user's authorized_keys."
	case strings.Contains(s, "permission denied"):
		return keyPath, "Login refused", "The login node did not accept the key: check ssh_key and that its public half is in the user's authorized_keys."
	case strings.Contains(s, "connection refused") || strings.Contains(s, "no route to host") ||
		strings.Contains(s, "timed out") || strings.Contains(s, "could not resolve"):
		if cfg.SSHPort != 0 && strings.Contains(s, "connection refused") {
			return []string{"ssh_port"}, "Login node unreachable", "Check login and ssh_port."
		}
		if len(cfg.bastions) > 0 {
			return []string{"login"}, "Login node unreachable", "Check bastion (that the engine's host reaches it) and login (and ssh_port; that the bastion reaches it): ssh's words above name the host that did not answer."
		}
		return []string{"login"}, "Login node unreachable", "Check login (and ssh_port), and that the engine's host can reach it."
	}
	return []string{"login"}, "ssh failed", "Check login and the ssh settings."
}

// cluster reads what the provisioner adapts to: the Slurm version,
// MaxArraySize and the RPC rate limiter, from scontrol show config. A
// configuration printed and then a DOWN from its closing ping is the
// limiter refusing the ping (slurm/internal/queue/ratelimit.go): the
// check goes on and says so, never "not reachable".
func (c *check) cluster(ctx context.Context) {
	conf, err := c.q.q.Facts(ctx)
	if err != nil {
		var stderr []byte
		if ce := (*queue.CommandError)(nil); errors.As(err, &ce) {
			stderr, err = ce.Stderr, ce.Err
		}
		said := truncate(firstNonEmpty(string(stderr), err.Error()))
		switch {
		case releaseMismatch(said):
			c.fail([]string{"login"}, "Slurm client and controller are different releases", "%s.", mismatchDetail(c.cfg.Login.String(), quoteLines(said)))
		case saidZeroBytes(said):
			c.fail([]string{"login"}, "Slurm client and controller are different releases",
				"%s. (A controller that dropped one connection says the same: if `sbatch --version` on the login node matches the cluster, check again.)", mismatchDetail(c.cfg.Login.String(), quoteLines(said)))
		case errors.Is(err, context.DeadlineExceeded):
			c.fail([]string{"login"}, "Slurm did not answer in time",
				"scontrol show config got no answer within the check's %s (-check-timeout) on %s: slurmctld is down or slow, or it rations RPCs (SlurmctldParameters=rl_enable) and this user's other clients keep the bucket empty. Check again, with a longer -check-timeout.", c.waited().Round(time.Second), c.cfg.Login)
		default:
			c.fail([]string{"login"}, "Slurm not reachable from the login node",
				"scontrol show config failed on %s: %s. The login node must have Slurm's client commands and reach slurmctld.", c.cfg.Login, quoteLines(said))
		}
		return
	}
	if conf.Version != "" {
		c.fact("slurm version", conf.Version)
	}
	if conf.Cluster != "" {
		c.fact("cluster", conf.Cluster)
		c.clusterName = conf.Cluster
	}
	size := "1001 (Slurm's default; not set)"
	if conf.MaxArraySize >= 0 {
		size = strconv.Itoa(conf.MaxArraySize)
		if conf.MaxArraySize <= 1 {
			size += " (job arrays off: a burst is one sbatch per machine)"
		}
	}
	c.fact("MaxArraySize", size)
	c.fact("RPC rate limiter", c.rateFact(conf))
}

// rateFact says what slurmctld's rate limiter allows and what this
// provisioner's polling costs against it, and whether it rationed the
// check itself.
func (c *check) rateFact(conf queue.Facts) string {
	limit := conf.RateLimit
	if !limit.On {
		return "off"
	}
	cost := c.q.q.PollCost()
	s := fmt.Sprintf("%s; this provisioner's poll costs %g every %s while it has jobs to watch (%.2f a second; 1 on Slurm 24.05 and later while every job it watches runs)",
		limit, cost, c.cfg.pollInterval, cost/c.cfg.pollInterval.Seconds())
	if conf.PingRationed {
		s = "rate limited: " + s + "; this user's bucket was empty during the check (scontrol's closing ping was refused, so it said DOWN right after slurmctld sent the configuration): commands wait their turn, which is not an outage"
	}
	return s
}

// limits shows the accounting limits of the login user (limits.go), and
// warns where the provisioner's caps are above them: the limit then binds
// first, and a reader of the configuration would expect bursts the site
// never allows.
func (c *check) limits(ctx context.Context) {
	lim, err := c.q.q.Limits(ctx, c.clusterName)
	if err != nil {
		c.fact("accounting limits", "unknown ("+strings.TrimSpace(truncateTo(err.Error(), 300))+"); bursts are fitted to the limits a refusal shows")
		return
	}
	if !lim.Submit.Set() && !lim.Jobs.Set() && !lim.CPUs.Set() {
		c.fact("accounting limits", "none for "+strings.Join(lim.Rows, ", "))
		return
	}
	c.fact("limit on jobs in the queue", lim.Submit.String())
	c.fact("limit on jobs running", lim.Jobs.String())
	c.fact("limit on CPUs running", lim.CPUs.String())
	warn := func(path []string, summary, format string, args ...any) {
		c.resp.Diagnostics = append(c.resp.Diagnostics, shared.Diagnostic{Severity: shared.SeverityWarning, Path: path,
			Summary: summary, Detail: fmt.Sprintf(format, args...)})
	}
	if l := lim.Submit; l.Set() && *c.cfg.MaxPending > l.N {
		warn([]string{"max_pending"}, "max_pending above the site's limit",
			"max_pending = %d, but the login user may have at most %d jobs or array tasks in the queue (%s). Bursts are trimmed to the room the limit leaves and the rest waits; set max_pending = %d or less to plan with what the site allows.",
			*c.cfg.MaxPending, l.N, l, l.N)
	}
	// A worker's job counts against the submit limit while it runs, and
	// against MaxJobs: the smaller caps the machines alive at once.
	alive := lim.Submit
	if lim.Jobs.Set() {
		alive.Lower(lim.Jobs.N, lim.Jobs.What)
	}
	if alive.Set() && *c.cfg.MaxWorkers > alive.N {
		warn([]string{"max_workers"}, "max_workers above the site's limit",
			"max_workers = %d, but the login user may have at most %d jobs running (%s): more machines than that are never alive at once, and the rest pend. Set max_workers = %d or less to plan with what the site allows.",
			*c.cfg.MaxWorkers, alive.N, alive, alive.N)
	}
	if l := lim.CPUs; l.Set() {
		for _, prof := range c.cfg.Profiles {
			if prof.CPUs > l.N {
				warn([]string{"profile", strconv.Itoa(c.index[prof.Name]), "cpus"}, "Profile larger than the site's CPU limit",
					"Profile %s asks for %d CPUs a machine, but the login user may have at most %d running (%s): its jobs would pend for ever.", prof.Name, prof.CPUs, l.N, l)
			}
		}
	}
}

// worker looks for the worker command on the login node, or, with
// worker_command unset, says where the shipped worker goes (ship.go).
func (c *check) worker(ctx context.Context) {
	if c.cfg.WorkerCommand == nil {
		c.shippedWorker(ctx)
		return
	}
	cmd := c.cfg.WorkerCommand[0]
	stdout, _, err := c.q.q.Run(ctx, nil, "sh", "-c", `command -v -- "$1"`, "sh", cmd)
	if err == nil {
		c.fact("worker command", strings.TrimSpace(lastLine(stdout)), "worker_command")
		return
	}
	prerun := false
	for _, pr := range c.cfg.Profiles {
		prerun = prerun || len(pr.Prerun) > 0
	}
	detail := fmt.Sprintf("%q is not on the login node's PATH (command -v found nothing), and a job would fail at once with \"command not found\". Install the worker where the compute nodes see it, or give its full path.", cmd)
	if prerun {
		// Prerun lines may put it on PATH (module load, a venv); they
		// run on the compute node only, so this is a warning.
		c.resp.Diagnostics = append(c.resp.Diagnostics, shared.Diagnostic{Severity: shared.SeverityWarning, Path: []string{"worker_command"},
			Summary: "Worker not found on the login node", Detail: detail + " (Profiles with prerun lines may put it on PATH on the compute nodes; this check does not run them.)"})
		return
	}
	c.fail([]string{"worker_command"}, "Worker not found", "%s", detail)
}

// profiles asks sbatch --test-only about each profile's script, the very
// script a run would submit for one machine of it.
func (c *check) profiles(ctx context.Context) {
	shapes, measured := c.readShapes(ctx)
	for _, prof := range c.cfg.Profiles {
		i := c.index[prof.Name]
		path := []string{"profile", strconv.Itoa(i)}
		if measured && c.tooLarge(shapes, prof, path) {
			continue
		}
		stdout, stderr, err := c.q.q.TestOnly(ctx, c.q.previewScript(prof))
		said := strings.TrimSpace(string(stderr) + "\n" + string(stdout))
		if err != nil {
			var ee *exec.ExitError
			unanswered := answerLost(err, stderr) || !errors.As(err, &ee) || (ee.ExitCode() == 255 && !strings.Contains(said, "sbatch:"))
			if unanswered {
				c.fail(path, "Slurm did not answer", "sbatch --test-only for profile %s did not get an answer: %s. Try again; if it persists, check the login node.", prof.Name, quoteLines(truncate(firstNonEmpty(said, err.Error()))))
				continue
			}
			if throttled(said) {
				// Weather, not the profile: the site's throttle
				// counted this very --test-only.
				c.resp.Diagnostics = append(c.resp.Diagnostics, shared.Diagnostic{Severity: shared.SeverityWarning, Path: path,
					Summary: "The site throttles submissions",
					Detail:  fmt.Sprintf("sbatch --test-only for profile %s says: %s.%s", prof.Name, quoteLines(truncate(said)), submitRuleHint(said))})
				continue
			}
			c.fail(sbatchBlame(prof, path, said), "Slurm refuses profile "+prof.Name,
				"sbatch --test-only says: %s.%s%s%s Fix the profile's sbatch lines (or the cluster side) and check again.", quoteLines(truncate(said)), deadlineHint(prof, said), submitRuleHint(said), partitionHint(shapes, said))
			continue
		}
		c.fact("profile "+prof.Name, "sbatch --test-only: "+strings.TrimPrefix(lastLine([]byte(said)), "sbatch: "), path...)
	}
}

// sbatchBlame points a refusal at the sbatch line it is about, when
// Slurm's words name the option's subject, else at the profile.
func sbatchBlame(prof Profile, path []string, said string) []string {
	s := strings.ToLower(said)
	for _, c := range []struct {
		words []string
		long  string
		short byte
	}{
		{[]string{"partition"}, "--partition", 'p'},
		// 24.11+ say this of a --deadline too soon for the time limit
		// (deadlineHint): a profile with its own --deadline is blamed
		// there, one without at its --time.
		{[]string{"requested time limit is invalid"}, "--deadline", 0},
		{[]string{"time limit", "--time"}, "--time", 't'},
		{[]string{"gres", "generic resource"}, "--gres", 0},
		{[]string{"account"}, "--account", 'A'},
		{[]string{"qos"}, "--qos", 'q'},
		{[]string{"feature"}, "--constraint", 'C'},
		{[]string{"reservation"}, "--reservation", 0},
		{[]string{"begin and deadline"}, "--begin", 'b'},
		{[]string{"memory"}, "--mem", 0},
	} {
		if !slicesContainsAny(s, c.words) {
			continue
		}
		for j, line := range prof.Sbatch {
			opts, _ := sbatch.ParseLine(line)
			for _, o := range opts {
				if o.Is(c.long, c.short) {
					return append(path, "sbatch", strconv.Itoa(j))
				}
			}
		}
	}
	if strings.Contains(s, "unrecognized option") || strings.Contains(s, "invalid option") {
		for j, line := range prof.Sbatch {
			for _, w := range sbatch.Words(line) {
				if strings.Contains(said, strings.SplitN(w, "=", 2)[0]+"'") {
					return append(path, "sbatch", strconv.Itoa(j))
				}
			}
		}
	}
	return path
}

func slicesContainsAny(s string, words []string) bool {
	for _, w := range words {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// lastLine is the last non-empty line of b.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// quoteLines puts what a program said in quotes, its lines joined, so a
// diagnostic reads as one sentence that quotes it.
func quoteLines(s string) string {
	return strconv.Quote(strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " / ")), " "))
}

var (
	_ shared.Checker   = (*Provisioner)(nil)
	_ shared.Previewer = (*Provisioner)(nil)
)
