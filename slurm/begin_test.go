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

// TestBeginForms: every --begin form Slurm's parse_time accepts is read
// as it reads it (when a job submitted at the fixed clock may start), the
// forms it refuses are errors at validate, and a profile with
// --time=01:00:00 and provision_timeout 15m is refused, at its --begin
// line with when its job may start and when its credential expires,
// exactly when its longest wait does not fit the credential's 12h cap.
func TestBeginForms(t *testing.T) {
	at := func(s string) time.Time {
		t.Helper()
		v, err := time.ParseInLocation("2006-01-02 15:04:05", s, testBeginNow.Location())
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		v       string
		start   string // when a job submitted at testBeginNow may start; "" for a form sbatch refuses
		refused string // what the refusal says, "" when the profile is accepted
	}{
		// The attack's own.
		{"2027-01-01T00:00:00", "2027-01-01 00:00:00", "may start at 2027-01-01 00:00:00 CEST; its worker's credential, minted at submission, expires at 2026-05-02 03:00:00 CEST"},
		{"tomorrow", "2026-05-02 00:00:00", "Submitted at 2026-05-02 00:00:00 CEST, a job of this profile may start at 2026-05-03 00:00:00 CEST"},
		{"teatime", "2026-05-01 16:00:00", "Submitted at 2026-05-01 16:00:00 CEST, a job of this profile may start at 2026-05-02 16:00:00 CEST (a time of day comes every day"},
		{"now+13hours", "2026-05-02 04:00:00", "may start at 2026-05-02 04:00:00 CEST"},
		{"now+1week", "2026-05-08 15:00:00", "the begin's 168h"},
		{"midnight", "2026-05-02 00:00:00", "a time of day comes every day"},
		// The other keywords: fika is 15:00, passed to the minute at
		// 15:00, so tomorrow's.
		{"noon", "2026-05-02 12:00:00", "every day"},
		{"elevenses", "2026-05-02 11:00:00", "every day"},
		{"fika", "2026-05-02 15:00:00", "every day"},
		{"teaTIME", "2026-05-01 16:00:00", "every day"},
		{"today", "2026-05-01 00:00:00", ""},
		{"today 06:00", "2026-05-01 06:00:00", ""}, // at most 6h after a submission at midnight
		{"today 16:00", "2026-05-01 16:00:00", "Submitted at 2026-05-02 00:00:00 CEST"},
		{"tomorrow 01:00", "2026-05-02 01:00:00", "every day"},
		{"noon tomorrow", "2026-05-02 12:00:00", "every day"},
		// now±N in every unit, as Slurm spells them.
		{"now", "2026-05-01 15:00:00", ""},
		{"now+90", "2026-05-01 15:01:30", ""},
		{"now+1second", "2026-05-01 15:00:01", ""},
		{"now+30seconds", "2026-05-01 15:00:30", ""},
		{"now+1minute", "2026-05-01 15:01:00", ""},
		{"now+90minutes", "2026-05-01 16:30:00", ""},
		{"now+1hour", "2026-05-01 16:00:00", ""},
		{"now+10hours", "2026-05-02 01:00:00", ""}, // 11h25m with the rest
		{"now+11hours", "2026-05-02 02:00:00", "need it for 12h25m"},
		{"now+9HOURS", "2026-05-02 00:00:00", ""},
		{"now+1day", "2026-05-02 15:00:00", "the begin's 24h"},
		{"now+2days", "2026-05-03 15:00:00", "the begin's 48h"},
		{"now+1week", "2026-05-08 15:00:00", "168h"},
		{"now+2weeks", "2026-05-15 15:00:00", "336h"},
		{"now + 2 hours", "2026-05-01 17:00:00", ""},
		{"now-5minutes", "2026-05-01 14:55:00", ""},
		// Dates and times.
		{"2026-05-01T17:00", "2026-05-01 17:00:00", ""},
		{"2026-05-01T17:00:30", "2026-05-01 17:00:30", ""},
		{"2026-05-01 17:00", "2026-05-01 17:00:00", ""},
		{"2026-05-01", "2026-05-01 00:00:00", ""},
		{"2020-01-01T00:00:00", "2020-01-01 00:00:00", ""},
		{"2026-05-02T03:00", "2026-05-02 03:00:00", "may start at 2026-05-02 03:00:00 CEST"},
		{"2099-01-01T00:00:00", "2099-01-01 00:00:00", "expires at 2026-05-02 03:00:00 CEST"},
		{"05/01/27", "2027-05-01 00:00:00", "2027-05-01 00:00:00"},
		{"05.01.27", "2027-05-01 00:00:00", "2027-05-01"},
		{"050127", "2027-05-01 00:00:00", "2027-05-01"},
		{"05/02", "2026-05-02 00:00:00", "a date without a year comes every year"},
		{"05/01", "2027-05-01 00:00:00", "every year"}, // today at midnight has passed: next year's
		{"01/10-08:00", "2027-01-10 08:00:00", "every year"},
		{"16:30", "2026-05-01 16:30:00", "every day"},
		{"4:30pm", "2026-05-01 16:30:00", "every day"},
		{"4:30 PM", "2026-05-01 16:30:00", "every day"},
		{"12:00am", "2026-05-02 00:00:00", "every day"},
		{"12:00pm", "2026-05-02 12:00:00", "every day"},
		{"15:00", "2026-05-02 15:00:00", "every day"},
		{"15:01", "2026-05-01 15:01:00", "every day"},
		{"uts1800000000", "2027-01-15 10:00:00", "may start at 2027-01-15 10:00:00 CEST"},
		{"uts1777640400", "2026-05-01 15:00:00", ""},
		// What sbatch refuses.
		{"now+5min", "", ""}, {"now+13h", "", ""}, {"now+1fortnight", "", ""}, {"now+", "", ""},
		{"now5", "", ""}, {"25:00", "", ""}, {"13:00pm", "", ""}, {"12:60", "", ""}, {"2027-13-01", "", ""},
		{"2027-01-32", "", ""}, {"13/01", "", ""}, {"next tuesday", "", ""}, {"", "", ""}, {"T", "", ""},
		{"uts12", "", ""}, {"uts1800000000x", "", ""}, {"2027-01-01t00:00", "", ""},
		// parse_time skips a capital T (of 2027-01-01T00:00) before it
		// looks for a word.
		{"TeaTime", "", ""}, {"Tomorrow", "", ""},
	} {
		b, err := parseBegin(c.v)
		switch {
		case c.start == "" && err == nil:
			t.Errorf("parseBegin(%q) = %+v; want sbatch's refusal", c.v, b)
			continue
		case c.start == "":
			if !strings.Contains(err.Error(), "sbatch refuses it at position") {
				t.Errorf("parseBegin(%q): %v; want where sbatch refuses it", c.v, err)
			}
		case err != nil:
			t.Errorf("parseBegin(%q): %v", c.v, err)
			continue
		default:
			if got, want := b.at(testBeginNow), at(c.start); !got.Equal(want) {
				t.Errorf("--begin=%s submitted at %s starts %s; want %s", c.v, testBeginNow, got, want)
			}
		}

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
		case c.start == "":
			if len(errs) != 1 || errs[0].Summary != "Invalid --begin" || strings.Join(errs[0].Path, ".") != "profile.0.sbatch.1" {
				t.Errorf("--begin=%s: %v; want one Invalid --begin at profile.0.sbatch.1", c.v, errs)
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
	script := string(p.script(prof, "http://e", "", "w", nil, [][]string{{"t"}}))
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
