package slurm

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// testBeginNow is the provisioner's clock in the --begin tests: a Friday
// afternoon, in a zone without daylight saving.
var testBeginNow = time.Date(2026, 5, 1, 15, 0, 0, 0, time.FixedZone("CEST", 2*3600))

// badBegin is what a profile's refusal says of a --begin sbatch refuses.
const badBegin = "sbatch refuses it at position"

// TestBeginForms: a profile with --time=01:00:00 and provision_timeout
// 15m is refused, at its --begin line with when its job may start and
// when its credential expires, exactly when its longest wait does not fit
// the credential's 12h cap; a form sbatch refuses is an Invalid --begin
// at that line. When each form starts is sbatch.TestBeginForms'.
func TestBeginForms(t *testing.T) {
	for _, c := range []struct {
		v       string
		refused string // what the refusal says, "" when the profile is accepted, badBegin for a form sbatch refuses
	}{
		// The attack's own.
		{"2027-01-01T00:00:00", "may start at 2027-01-01 00:00:00 CEST; its worker's credential, minted at submission, expires at 2026-05-02 03:00:00 CEST"},
		{"tomorrow", "Submitted at 2026-05-02 00:00:00 CEST, a job of this profile may start at 2026-05-03 00:00:00 CEST"},
		{"teatime", "Submitted at 2026-05-01 16:00:00 CEST, a job of this profile may start at 2026-05-02 16:00:00 CEST (a time of day comes every day"},
		{"now+13hours", "may start at 2026-05-02 04:00:00 CEST"},
		{"now+1week", "the begin's 168h"},
		{"midnight", "a time of day comes every day"},
		// The other keywords: fika is 15:00, passed to the minute at
		// 15:00, so tomorrow's.
		{"noon", "every day"},
		{"elevenses", "every day"},
		{"fika", "every day"},
		{"teaTIME", "every day"},
		{"today", ""},
		{"today 06:00", ""}, // at most 6h after a submission at midnight
		{"today 16:00", "Submitted at 2026-05-02 00:00:00 CEST"},
		{"tomorrow 01:00", "every day"},
		{"noon tomorrow", "every day"},
		// now±N in every unit, as Slurm spells them.
		{"now", ""},
		{"now+90", ""},
		{"now+1second", ""},
		{"now+30seconds", ""},
		{"now+1minute", ""},
		{"now+90minutes", ""},
		{"now+1hour", ""},
		{"now+10hours", ""}, // 11h25m with the rest
		{"now+11hours", "need it for 12h25m"},
		{"now+9HOURS", ""},
		{"now+1day", "the begin's 24h"},
		{"now+2days", "the begin's 48h"},
		{"now+1week", "168h"},
		{"now+2weeks", "336h"},
		{"now + 2 hours", ""},
		{"now-5minutes", ""},
		// Dates and times.
		{"2026-05-01T17:00", ""},
		{"2026-05-01T17:00:30", ""},
		{"2026-05-01 17:00", ""},
		{"2026-05-01", ""},
		{"2020-01-01T00:00:00", ""},
		{"2026-05-02T03:00", "may start at 2026-05-02 03:00:00 CEST"},
		{"2099-01-01T00:00:00", "expires at 2026-05-02 03:00:00 CEST"},
		{"05/01/27", "2027-05-01 00:00:00"},
		{"05.01.27", "2027-05-01"},
		{"050127", "2027-05-01"},
		{"05/02", "a date without a year comes every year"},
		{"05/01", "every year"}, // today at midnight has passed: next year's
		{"01/10-08:00", "every year"},
		{"16:30", "every day"},
		{"4:30pm", "every day"},
		{"4:30 PM", "every day"},
		{"12:00am", "every day"},
		{"12:00pm", "every day"},
		{"15:00", "every day"},
		{"15:01", "every day"},
		{"uts1800000000", "may start at 2027-01-15 10:00:00 CEST"},
		{"uts1777640400", ""},
		// What sbatch refuses.
		{"now+5min", badBegin}, {"now+13h", badBegin}, {"now+1fortnight", badBegin}, {"now+", badBegin},
		{"now5", badBegin}, {"25:00", badBegin}, {"13:00pm", badBegin}, {"12:60", badBegin}, {"2027-13-01", badBegin},
		{"2027-01-32", badBegin}, {"13/01", badBegin}, {"next tuesday", badBegin}, {"", badBegin}, {"T", badBegin},
		{"uts12", badBegin}, {"uts1800000000x", badBegin}, {"2027-01-01t00:00", badBegin},
		// parse_time skips a capital T (of 2027-01-01T00:00) before it
		// looks for a word.
		{"TeaTime", badBegin}, {"Tomorrow", badBegin},
	} {
		// The profile, through validation at the fixed clock.
		cfg := baseConfig()
		cfg["token_ttl"] = ""
		cfg["profile"] = []any{map[string]any{"name": "p", "cpus": 1, "gpus": 0, "ram_mb": 0, "labels": nil,
			"sbatch": []string{"--time=01:00:00", "--begin='" + c.v + "'"}, "prerun": nil}}
		_, diags := parseConfigAt("hpc", mustJSON(t, cfg), testBeginNow)
		var errs shared.Diagnostics
		for _, d := range diags {
			if d.Severity == shared.SeverityError {
				errs = append(errs, d)
			}
		}
		switch {
		case c.refused == badBegin:
			if len(errs) != 1 || errs[0].Summary != "Invalid --begin" || strings.Join(errs[0].Path, ".") != "profile.0.sbatch.1" || !strings.Contains(errs[0].Detail, badBegin) {
				t.Errorf("--begin=%s: %v; want one Invalid --begin at profile.0.sbatch.1 saying where sbatch refuses it", c.v, errs)
			}
		case c.refused == "" && len(diags) != 0:
			t.Errorf("--begin=%s: %v; want it accepted", c.v, diags)
		case c.refused != "" && (len(errs) != 1 || strings.Join(errs[0].Path, ".") != "profile.0.sbatch.1" || !strings.Contains(errs[0].Detail, c.refused)):
			t.Errorf("--begin=%s: %v; want one error at profile.0.sbatch.1 saying %q", c.v, errs, c.refused)
		}
	}
}

// TestBeginCountsFromTheBegin: a wall-clock begin that fits is treated
// as now+N, N worked out at submission on the provisioner's clock plus
// beginClockMargin: the credential is minted to last from it, the
// --deadline is set from it, and provision_timeout counts from it.
func TestBeginCountsFromTheBegin(t *testing.T) {
	cfg := baseConfig()
	cfg["token_ttl"] = ""
	cfg["profile"] = []any{map[string]any{"name": "p", "cpus": 1, "gpus": 0, "ram_mb": 0, "labels": nil,
		"sbatch": []string{"--time=01:00:00", "--begin=2026-05-01T17:00"}, "prerun": nil}}
	s, diags := parseConfigAt("hpc", mustJSON(t, cfg), testBeginNow)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	prof := s.Profiles[0]
	delay := 2*time.Hour + beginClockMargin
	if got := s.beginDelayOf("p", testBeginNow); got != delay {
		t.Errorf("provision_timeout counts from %s after the request; want %s", got, delay)
	}
	// An hour later the begin is an hour nearer.
	if got := s.beginDelayOf("p", testBeginNow.Add(time.Hour)); got != delay-time.Hour {
		t.Errorf("an hour later: %s; want %s", got, delay-time.Hour)
	}
	if got, want := s.credentialTTL(prof, testBeginNow), delay+15*time.Minute+time.Hour+tokenMargin; got != want {
		t.Errorf("credential TTL %s; want %s (from the begin)", got, want)
	}
	p := New(nil)
	p.cfg = s
	p.now = func() time.Time { return testBeginNow }
	script := string(p.sub.script(prof, "http://e", "", "w", nil, [][]string{{"t"}}))
	if want := "#SBATCH --deadline=now+" + strconv.Itoa(int((delay + 15*time.Minute + time.Hour).Seconds())) + "seconds\n"; !strings.Contains(script, want) {
		t.Errorf("the script has no %q:\n%s", want, script)
	}
	// A begin already past is now, with the margin.
	if got := s.beginDelayOf("p", testBeginNow.Add(5*time.Hour)); got != beginClockMargin {
		t.Errorf("after the begin: %s; want %s", got, beginClockMargin)
	}
	// A relative begin has no margin: it is counted on the cluster's clock.
	if got := s.beginDelayAt(Profile{Name: "other", Sbatch: []string{"--begin=now+1hour"}}, testBeginNow); got != time.Hour {
		t.Errorf("now+1hour: %s", got)
	}
}
