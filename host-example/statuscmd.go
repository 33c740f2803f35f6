package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/internal/termsafe"
)

// statusMain is the status command: GET /status of a running engine,
// printed for a terminal. With -watch it prints it again every period,
// redrawn in place on a terminal, until SIGINT or SIGTERM.
func statusMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: host-example status [-watch PERIOD] [-token-env VAR] URL")
		fmt.Fprintln(fs.Output(), "Prints a running engine's GET /status for a terminal. URL is the engine's (http://127.0.0.1:8765).")
		fs.PrintDefaults()
	}
	watch := fs.Duration("watch", 0, "print it again every `period` (2s, 10s) until Ctrl-C")
	tokenEnv := fs.String("token-env", "", "the environment `variable` holding the engine's operator token (engine.operator_token_env); without it, the engine must be this machine's and yours")
	rest, code, done := parseArgs(fs, args, stdout, stderr)
	if done {
		return code
	}
	if len(rest) != 1 {
		return usageError(fs, stderr, "takes the engine's URL, got %q", rest)
	}
	u, err := url.Parse(strings.TrimSuffix(rest[0], "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usageError(fs, stderr, "%q is not the engine's http(s) URL", rest[0])
	}
	if *watch < 0 || (*watch > 0 && *watch < 100*time.Millisecond) {
		return usageError(fs, stderr, "-watch %s: give a period of at least 100ms", *watch)
	}
	token := ""
	if *tokenEnv != "" {
		if token = os.Getenv(*tokenEnv); token == "" {
			fmt.Fprintf(stderr, "host-example: -token-env names %s, which is not set\n", *tokenEnv)
			return 1
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	client := &http.Client{Timeout: 30 * time.Second}
	out := termsafe.Writer(stdout)
	redraw := *watch > 0 && isTerminal(stdout)
	for {
		text, err := fetchStatus(ctx, client, u.String()+"/status", token)
		if ctx.Err() != nil {
			return 0
		}
		if err != nil && *watch == 0 {
			fmt.Fprintf(stderr, "host-example: %v\n", err)
			return 1
		}
		if err != nil {
			text = fmt.Sprintf("%s: %v\n", time.Now().Format(time.TimeOnly), err)
		}
		if redraw {
			// Home, then clear to the end: the picture is replaced, not
			// scrolled.
			io.WriteString(stdout, "\x1b[H\x1b[2J")
		}
		io.WriteString(out, text)
		if *watch == 0 {
			return 0
		}
		if !redraw {
			io.WriteString(stdout, "\n")
		}
		t := time.NewTimer(*watch)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0
		case <-t.C:
		}
	}
}

// isTerminal says w is a character device (a terminal), where a picture
// can be redrawn in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// statusView is the part of GET /status the command shows.
type statusView struct {
	EngineID string `json:"engine_id"`
	Config   struct {
		Generation int    `json:"generation"`
		Digest     string `json:"digest"`
	} `json:"config"`
	Provisioners []struct {
		Name             string `json:"name"`
		Kind             string `json:"kind"`
		Process          string `json:"process"`
		Error            string `json:"error"`
		OutstandingTotal int    `json:"outstanding_total"`
		Status           *struct {
			Counts []struct {
				Profile  string `json:"profile"`
				Pending  int    `json:"pending"`
				Starting int    `json:"starting"`
				Attached int    `json:"attached"`
			} `json:"counts"`
			LastError string   `json:"last_error"`
			Notes     []string `json:"notes"`
		} `json:"status"`
	} `json:"provisioners"`
	Workers []struct {
		Name     string `json:"name"`
		JobID    string `json:"job_id"`
		Hostname string `json:"hostname"`
		CPUs     int    `json:"cpus"`
		GPUs     int    `json:"gpus"`
		// Task is the task's id; AttemptID is set whenever the worker
		// holds work (the stand-in's has no task id).
		Task      string `json:"task"`
		Attempt   int    `json:"attempt"`
		AttemptID string `json:"attempt_id"`
	} `json:"workers"`
	Needs []struct {
		ID     string `json:"id"`
		Spec   string `json:"spec"`
		State  string `json:"state"`
		Reason string `json:"reason"`
		Detail string `json:"detail"`
	} `json:"needs"`
	// Summary counts everything, whatever the lists hold; nil from an
	// engine before it, whose lists are then counted.
	Summary  *statusSummary `json:"summary"`
	HeldBack []struct {
		Provisioner string    `json:"provisioner"`
		Profile     string    `json:"profile"`
		Failures    int       `json:"failures"`
		Until       time.Time `json:"until"`
		Held        bool      `json:"held"`
		LastError   string    `json:"last_error"`
	} `json:"held_back"`
}

// statusSummary is GET /status's summary, as the command shows it.
type statusSummary struct {
	Tasks engine.TaskCounts `json:"tasks"`
	Needs struct {
		Waiting   int            `json:"waiting"`
		Assigned  int            `json:"assigned"`
		Served    int            `json:"served"`
		Forgotten int            `json:"forgotten"`
		ByReason  map[string]int `json:"by_reason"`
	} `json:"needs"`
	Workers struct {
		Attached int `json:"attached"`
		Busy     int `json:"busy"`
		Idle     int `json:"idle"`
	} `json:"workers"`
}

// maxListed bounds the workers and waiting needs listed one a line; the
// rest are counted.
const maxListed = 10

// statusQuery asks for what the command lists, and the counts of the
// rest: with 100,000 tasks queued, the whole /status is tens of MB.
var statusQuery = fmt.Sprintf("?limit=%d&state=waiting", maxListed)

func fetchStatus(ctx context.Context, client *http.Client, u, token string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+statusQuery, nil)
	if err != nil {
		return "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized, http.StatusForbidden:
		return "", fmt.Errorf("GET %s: %s: the operator's endpoints answer the engine's own user and root on its machine, or the operator token (-token-env)", u, resp.Status)
	default:
		return "", fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	var st statusView
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return "", fmt.Errorf("GET %s: not an engine's status: %w", u, err)
	}
	return formatStatus(st, u, time.Now()), nil
}

// formatStatus is the status as a terminal shows it.
func formatStatus(st statusView, u string, now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "engine %s at %s, %s, configuration %d (%s)\n", st.EngineID, strings.TrimSuffix(u, "/status"), now.Format(time.TimeOnly),
		st.Config.Generation, orDash(st.Config.Digest))
	formatProvisioners(&b, st)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	sum := st.summarize()
	fmt.Fprintf(&b, "\nworkers: %d attached, %d busy, %d idle\n", sum.Workers.Attached, sum.Workers.Busy, sum.Workers.Idle)
	for i, w := range st.Workers {
		if i == maxListed {
			break
		}
		doing := "idle"
		switch {
		case w.Task != "":
			doing = fmt.Sprintf("running task %s (attempt %d)", w.Task, w.Attempt)
		case w.AttemptID != "":
			doing = "busy with a need's work"
		}
		fmt.Fprintf(tw, "  %s\tjob %s\t%s\t%d cpus, %d gpus\t%s\n", w.Name, orDash(w.JobID), w.Hostname, w.CPUs, w.GPUs, doing)
	}
	if n := sum.Workers.Attached - min(len(st.Workers), maxListed); n > 0 {
		fmt.Fprintf(tw, "  … and %d more\n", n)
	}
	tw.Flush()
	if t := sum.Tasks; t.Submitted > 0 {
		fmt.Fprintf(&b, "\ntasks: %d submitted: %d waiting, %d running, %d succeeded, %d failed, %d timed out, %d cancelled, %d lost\n",
			t.Submitted, t.Waiting, t.Running, t.Succeeded, t.Failed, t.TimedOut, t.Cancelled, t.Lost)
	}
	var why []string
	for r, c := range sum.Needs.ByReason {
		why = append(why, fmt.Sprintf("%d %s", c, r))
	}
	sort.Strings(why)
	line := fmt.Sprintf("\nneeds: %d waiting", sum.Needs.Waiting)
	if len(why) > 0 {
		line += " (" + strings.Join(why, ", ") + ")"
	}
	fmt.Fprintf(&b, "%s, %d assigned, %d served\n", line, sum.Needs.Assigned, sum.Needs.Served+sum.Needs.Forgotten)
	listed := 0
	for _, n := range st.Needs {
		if n.State != "waiting" || listed == maxListed {
			continue
		}
		listed++
		fmt.Fprintf(&b, "  %s (%s): %s\n", n.ID, n.Spec, n.Detail)
	}
	if n := sum.Needs.Waiting - listed; n > 0 && listed > 0 {
		fmt.Fprintf(&b, "  … and %d more waiting\n", n)
	}
	for _, h := range st.HeldBack {
		if !h.Held {
			continue
		}
		fmt.Fprintf(&b, "\nheld back: %s on %s after %d failure(s), until %s: %s\n", h.Profile, h.Provisioner, h.Failures, h.Until.Local().Format(time.TimeOnly), h.LastError)
	}
	return b.String()
}

// summarize is st's summary: the engine's, or, from an engine that
// sends none, its lists counted.
func (st statusView) summarize() statusSummary {
	if st.Summary != nil {
		return *st.Summary
	}
	var sum statusSummary
	sum.Workers.Attached = len(st.Workers)
	for _, w := range st.Workers {
		if w.AttemptID != "" || w.Task != "" {
			sum.Workers.Busy++
		}
	}
	sum.Workers.Idle = sum.Workers.Attached - sum.Workers.Busy
	sum.Needs.ByReason = map[string]int{}
	for _, n := range st.Needs {
		switch n.State {
		case "waiting":
			sum.Needs.Waiting++
			sum.Needs.ByReason[n.Reason]++
		case "assigned":
			sum.Needs.Assigned++
		case "served":
			sum.Needs.Served++
		}
	}
	return sum
}

// formatProvisioners writes the provisioners' part of the status.
func formatProvisioners(b *strings.Builder, st statusView) {
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nprovisioners\n")
	for _, p := range st.Provisioners {
		var counts []string
		if p.Status != nil {
			for _, c := range p.Status.Counts {
				counts = append(counts, fmt.Sprintf("%s: %d pending, %d starting, %d attached", c.Profile, c.Pending, c.Starting, c.Attached))
			}
		}
		if len(counts) == 0 {
			counts = []string{"nothing asked for"}
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", p.Name, p.Kind, p.Process, strings.Join(counts, "; "))
		if p.Error != "" {
			fmt.Fprintf(tw, "  \t\t\terror: %s\n", p.Error)
		}
		if p.Status != nil {
			if p.Status.LastError != "" {
				fmt.Fprintf(tw, "  \t\t\tlast error: %s\n", p.Status.LastError)
			}
			for _, n := range p.Status.Notes {
				fmt.Fprintf(tw, "  \t\t\tnote: %s\n", n)
			}
		}
	}
	tw.Flush()
}
