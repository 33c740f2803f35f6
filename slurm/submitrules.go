package slurm

// A site's submit rules: job_submit plugins that refuse a job as it is
// submitted, in the site's own words. Two are common and ship with every
// Slurm (job_submit_require_timelimit.so and job_submit_throttle.so in
// Debian's 22.05, 24.11 and 26.05):
//
//   - require_timelimit refuses a job without --time: "Time limit
//     specification required, but not provided". That is a verdict on
//     the profile (refusal.go's verdicts): misconfigured, and the fix is a
//     --time line in its sbatch (submitRuleHint), which validate -check
//     shows at the profile's line, since --test-only meets the rule too.
//   - throttle caps a user's submissions an hour (SchedulerParameters=
//     jobs_per_user_per_hour): "Reached jobs per hour limit", then "Job
//     violates accounting/QOS policy (job submit limit, ...)". That is
//     weather, and not a limit of the queue: the plugin counts
//     submissions, and gives one back every 6 minutes (Slurm's
//     job_submit_throttle.c takes one off each user's count per 6 minutes
//     gone). So the whole provisioner waits throttleWait and asks again:
//     no profile backs off, and learning a queue limit from it (limits.go)
//     would only shrink the next burst for nothing. Each machine refused
//     is said failed, limit_reached, with the site's words and the time
//     of the next try; Provision answers the demand capped until then.
//
// Other rules (job_submit/lua) speak in the site's words, which sbatch
// prints before its own; they come out whole in the failure's detail and
// stay weather unless Slurm's own words make them a verdict.

import (
	"fmt"
	"strings"
	"time"
)

// throttleWait is how long after a throttle's refusal the provisioner
// asks again: job_submit/throttle gives a user one submission back per 6
// minutes.
const throttleWait = 6 * time.Minute

// throttleWords are job_submit/throttle's refusal, lower case.
const throttleWords = "reached jobs per hour limit"

// throttled reports whether said is job_submit/throttle refusing.
func throttled(said string) bool {
	return strings.Contains(strings.ToLower(said), throttleWords)
}

// submitRuleHint is what to do about a site rule's refusal, for the
// failure's detail and validate -check: "" for anything else.
func submitRuleHint(said string) string {
	s := strings.ToLower(said)
	switch {
	case strings.Contains(s, "time limit specification required"):
		return " (The site requires a time limit on every job, job_submit/require_timelimit: add a line such as \"--time=01:00:00\" to the profile's sbatch.)"
	case strings.Contains(s, throttleWords):
		return fmt.Sprintf(" (The site caps submissions per user an hour, job_submit/throttle, and gives one back every %s: the provisioner asks again then. Every sbatch counts, --test-only too.)", throttleWait)
	}
	return ""
}

// throttleDetail is what Provision and Status say while the throttle
// holds.
func throttleDetail(said string, until time.Time) string {
	return fmt.Sprintf("%s: the site's submit rule refused a submission (%s); asking again at %s, when job_submit/throttle gives one back (every %s)",
		limitReached, strings.TrimSpace(said), until.UTC().Format(time.RFC3339), throttleWait)
}
