package sbatch

import (
	"strings"
	"testing"
	"time"
)

// testBeginNow is the submission's clock in the --begin tests: a Friday
// afternoon, in a zone without daylight saving.
var testBeginNow = time.Date(2026, 5, 1, 15, 0, 0, 0, time.FixedZone("CEST", 2*3600))

// TestBeginForms: every --begin form Slurm's parse_time accepts is read
// as it reads it (when a job submitted at the fixed clock may start), and
// the forms it refuses are errors that say where sbatch refuses them.
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
		v     string
		start string // when a job submitted at testBeginNow may start; "" for a form sbatch refuses
	}{
		// The attack's own.
		{"2027-01-01T00:00:00", "2027-01-01 00:00:00"},
		{"tomorrow", "2026-05-02 00:00:00"},
		{"teatime", "2026-05-01 16:00:00"},
		{"now+13hours", "2026-05-02 04:00:00"},
		{"now+1week", "2026-05-08 15:00:00"},
		{"midnight", "2026-05-02 00:00:00"},
		// The other keywords: fika is 15:00, passed to the minute at
		// 15:00, so tomorrow's.
		{"noon", "2026-05-02 12:00:00"},
		{"elevenses", "2026-05-02 11:00:00"},
		{"fika", "2026-05-02 15:00:00"},
		{"teaTIME", "2026-05-01 16:00:00"},
		{"today", "2026-05-01 00:00:00"},
		{"today 06:00", "2026-05-01 06:00:00"}, // at most 6h after a submission at midnight
		{"today 16:00", "2026-05-01 16:00:00"},
		{"tomorrow 01:00", "2026-05-02 01:00:00"},
		{"noon tomorrow", "2026-05-02 12:00:00"},
		// now±N in every unit, as Slurm spells them.
		{"now", "2026-05-01 15:00:00"},
		{"now+90", "2026-05-01 15:01:30"},
		{"now+1second", "2026-05-01 15:00:01"},
		{"now+30seconds", "2026-05-01 15:00:30"},
		{"now+1minute", "2026-05-01 15:01:00"},
		{"now+90minutes", "2026-05-01 16:30:00"},
		{"now+1hour", "2026-05-01 16:00:00"},
		{"now+10hours", "2026-05-02 01:00:00"}, // 11h25m with the rest
		{"now+11hours", "2026-05-02 02:00:00"},
		{"now+9HOURS", "2026-05-02 00:00:00"},
		{"now+1day", "2026-05-02 15:00:00"},
		{"now+2days", "2026-05-03 15:00:00"},
		{"now+1week", "2026-05-08 15:00:00"},
		{"now+2weeks", "2026-05-15 15:00:00"},
		{"now + 2 hours", "2026-05-01 17:00:00"},
		{"now-5minutes", "2026-05-01 14:55:00"},
		// Dates and times.
		{"2026-05-01T17:00", "2026-05-01 17:00:00"},
		{"2026-05-01T17:00:30", "2026-05-01 17:00:30"},
		{"2026-05-01 17:00", "2026-05-01 17:00:00"},
		{"2026-05-01", "2026-05-01 00:00:00"},
		{"2020-01-01T00:00:00", "2020-01-01 00:00:00"},
		{"2026-05-02T03:00", "2026-05-02 03:00:00"},
		{"2099-01-01T00:00:00", "2099-01-01 00:00:00"},
		{"05/01/27", "2027-05-01 00:00:00"},
		{"05.01.27", "2027-05-01 00:00:00"},
		{"050127", "2027-05-01 00:00:00"},
		{"05/02", "2026-05-02 00:00:00"},
		{"05/01", "2027-05-01 00:00:00"}, // today at midnight has passed: next year's
		{"01/10-08:00", "2027-01-10 08:00:00"},
		{"16:30", "2026-05-01 16:30:00"},
		{"4:30pm", "2026-05-01 16:30:00"},
		{"4:30 PM", "2026-05-01 16:30:00"},
		{"12:00am", "2026-05-02 00:00:00"},
		{"12:00pm", "2026-05-02 12:00:00"},
		{"15:00", "2026-05-02 15:00:00"},
		{"15:01", "2026-05-01 15:01:00"},
		{"uts1800000000", "2027-01-15 10:00:00"},
		{"uts1777640400", "2026-05-01 15:00:00"},
		// What sbatch refuses.
		{"now+5min", ""}, {"now+13h", ""}, {"now+1fortnight", ""}, {"now+", ""},
		{"now5", ""}, {"25:00", ""}, {"13:00pm", ""}, {"12:60", ""}, {"2027-13-01", ""},
		{"2027-01-32", ""}, {"13/01", ""}, {"next tuesday", ""}, {"", ""}, {"T", ""},
		{"uts12", ""}, {"uts1800000000x", ""}, {"2027-01-01t00:00", ""},
		// parse_time skips a capital T (of 2027-01-01T00:00) before it
		// looks for a word.
		{"TeaTime", ""}, {"Tomorrow", ""},
	} {
		b, err := ParseBegin(c.v)
		switch {
		case c.start == "" && err == nil:
			t.Errorf("ParseBegin(%q) = %+v; want sbatch's refusal", c.v, b)
			continue
		case c.start == "":
			if !strings.Contains(err.Error(), "sbatch refuses it at position") {
				t.Errorf("ParseBegin(%q): %v; want where sbatch refuses it", c.v, err)
			}
		case err != nil:
			t.Errorf("ParseBegin(%q): %v", c.v, err)
			continue
		default:
			if got, want := b.At(testBeginNow), at(c.start); !got.Equal(want) {
				t.Errorf("--begin=%s submitted at %s starts %s; want %s", c.v, testBeginNow, got, want)
			}
		}
	}
}

// TestRelativeBegin reads now±N as a delay after submission, and no other
// form.
func TestRelativeBegin(t *testing.T) {
	for _, c := range []struct {
		v     string
		delay time.Duration
		ok    bool
	}{
		{"now", 0, true}, {"now+60", time.Minute, true}, {"now+90minutes", 90 * time.Minute, true},
		{"now+1hour", time.Hour, true}, {"now+2days", 48 * time.Hour, true}, {"now+1week", 7 * 24 * time.Hour, true},
		{"now+5min", 0, false}, {"16:00", 0, false}, {"2027-01-10T08:00", 0, false}, {"tomorrow", 0, false},
		{"now+1fortnight", 0, false}, {"now-5", 0, true},
	} {
		if d, ok := RelativeBegin(c.v); d != c.delay || ok != c.ok {
			t.Errorf("RelativeBegin(%q) = %s, %v; want %s, %v", c.v, d, ok, c.delay, c.ok)
		}
	}
}
