package queue

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
)

// The accounting limits of the login user, as sacctmgr shows them
// (slurmdbd answers it, so it costs slurmctld nothing). What they mean
// for a burst is the provisioner's (slurm/limits.go).

// Limit is one number a site sets, and where it comes from ("association
// proj/alice MaxSubmitJobs"). The zero value is no limit.
type Limit struct {
	N    int
	What string
}

// Set reports whether a site sets the limit.
func (l Limit) Set() bool { return l.What != "" }

// Lower keeps the smaller of l and n (n < 0 is none), naming what.
func (l *Limit) Lower(n int, what string) {
	if n >= 0 && (!l.Set() || n < l.N) {
		l.N, l.What = n, what
	}
}

// String is the limit and where it comes from, or "none".
func (l Limit) String() string {
	if !l.Set() {
		return "none"
	}
	return fmt.Sprintf("%s = %d", l.What, l.N)
}

// UserLimits are the limits that apply to the login user, as sacctmgr
// shows them.
type UserLimits struct {
	// Submit caps the user's jobs and array tasks in the queue; Jobs
	// caps those running; CPUs the CPUs of the user's running jobs.
	Submit, Jobs, CPUs Limit
	// Rows are the associations read, for validate ("proj/alice").
	Rows []string
}

// assocArgs is the sacctmgr that reads the user's associations; qosArgs
// the one that reads the QOSes.
func assocArgs(user string) []string {
	return []string{"sacctmgr", "-nP", "show", "assoc", "where", "user=" + user,
		"format=cluster,account,partition,maxsubmit,maxjobs,grpsubmit,grpjobs,grptres,qos"}
}

func qosArgs() []string {
	return []string{"sacctmgr", "-nP", "show", "qos", "format=name,maxsubmitpu,maxjobspu,maxtrespu"}
}

// LoginUser is the user the queue logs in as: the login's user part
// (Config.User), or what the login node says (an ssh_config may name
// it).
func (q *Queue) LoginUser(ctx context.Context) (string, error) {
	if q.cfg.User != "" {
		return q.cfg.User, nil
	}
	stdout, stderr, err := q.Run(ctx, nil, "id", "-un")
	if err != nil {
		return "", WithStderr(err, stderr)
	}
	u := lastLine(stdout)
	if u == "" {
		return "", fmt.Errorf("id -un on %s printed nothing", q.cfg.Host)
	}
	return u, nil
}

// Limits asks sacctmgr, as the login user, for the limits that apply
// to it in cluster (every cluster's when empty). An error says why they
// could not be read: no accounting, sacctmgr refused, ssh.
func (q *Queue) Limits(ctx context.Context, cluster string) (UserLimits, error) {
	user, err := q.LoginUser(ctx)
	if err != nil {
		return UserLimits{}, fmt.Errorf("finding the login user: %w", err)
	}
	stdout, stderr, err := q.Run(ctx, nil, assocArgs(user)...)
	if err != nil {
		return UserLimits{}, fmt.Errorf("sacctmgr show assoc on %s: %w", q.cfg.Host, WithStderr(err, stderr))
	}
	lim, qoses := parseAssocs(stdout, user, cluster)
	if len(qoses) > 0 {
		stdout, stderr, err = q.Run(ctx, nil, qosArgs()...)
		if err != nil {
			return UserLimits{}, fmt.Errorf("sacctmgr show qos on %s: %w", q.cfg.Host, WithStderr(err, stderr))
		}
		parseQOS(stdout, qoses, &lim)
	}
	return lim, nil
}

// parseAssocs reads the user's association rows (assocArgs's format) of
// cluster, or of every cluster when it is empty, and returns the QOSes
// they name.
func parseAssocs(out []byte, user, cluster string) (UserLimits, map[string]bool) {
	var lim UserLimits
	qoses := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Split(strings.TrimSpace(sc.Text()), "|")
		if len(f) != 9 || (cluster != "" && f[0] != cluster) {
			continue // a banner, or another cluster's
		}
		name := "association " + f[1] + "/" + user
		if f[2] != "" {
			name += " (partition " + f[2] + ")"
		}
		lim.Rows = append(lim.Rows, strings.TrimPrefix(name, "association "))
		lim.Submit.Lower(atoiOr(f[3]), name+" MaxSubmitJobs")
		lim.Jobs.Lower(atoiOr(f[4]), name+" MaxJobs")
		lim.Submit.Lower(atoiOr(f[5]), name+" GrpSubmitJobs")
		lim.Jobs.Lower(atoiOr(f[6]), name+" GrpJobs")
		lim.CPUs.Lower(tresCPU(f[7]), name+" GrpTRES cpu")
		for _, q := range strings.Split(f[8], ",") {
			if q = strings.TrimSpace(q); q != "" {
				qoses[q] = true
			}
		}
	}
	return lim, qoses
}

// parseQOS lowers lim by the per-user limits of the QOSes named.
func parseQOS(out []byte, qoses map[string]bool, lim *UserLimits) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Split(strings.TrimSpace(sc.Text()), "|")
		if len(f) != 4 || !qoses[f[0]] {
			continue
		}
		name := "QOS " + f[0]
		lim.Submit.Lower(atoiOr(f[1]), name+" MaxSubmitJobsPerUser")
		lim.Jobs.Lower(atoiOr(f[2]), name+" MaxJobsPerUser")
		lim.CPUs.Lower(tresCPU(f[3]), name+" MaxTRESPerUser cpu")
	}
}

// atoiOr is a limit's number, -1 for none (empty) or anything else.
func atoiOr(s string) int {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// tresCPU is the cpu count of a TRES list ("cpu=8,mem=16G"), -1 for none.
func tresCPU(s string) int {
	for _, kv := range strings.Split(s, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == "cpu" {
			return atoiOr(v)
		}
	}
	return -1
}

// lastLine is the last line of what a command printed, trimmed: what
// follows a login banner.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
