// Package conformance runs a provisioner plugin binary through the
// Provisioner contract, as a host would, and reports where the plugin
// breaks it. It is for plugin authors in any language: without Go, run
// the checker binary built from provisioner-conformance/ (`make build`
// puts it in bin/); from a Go test, call Run.
//
//	bin/provisioner-conformance -plugin ./provisioner-mykind -config mykind.hcl \
//	    [-invalid broken.hcl]... [-failing failing.hcl]
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Config{
//			Binary: "./bin/provisioner-mykind",
//			HCL:    `endpoint = "https://example.test"`,
//			Invalid: []conformance.Invalid{
//				{HCL: `endpoint = "not a url"`, Path: []string{"endpoint"}},
//			},
//		})
//	}
//
// Both run the same checks (Checks lists them), in order; the binary
// prints one line per check and Run makes each a subtest. They cover the
// handshake and the magic cookie; Info and the contract version; the
// schema (valid, stable, able to decode the given HCL); ValidateConfig
// (accepts the good configuration, rejects each broken one at the
// expected path); the error details a plugin must send (NOT_CONFIGURED
// before Configure, SHUT_DOWN after Shutdown: a bare code reads as "not
// configured"); Configure; Shapes, and Covers where the plugin offers it
// (deprecated since contract 2.5), agree; Provision answers a
// demand promptly, entry by entry, asks for nothing new the second time
// and is followed by an event per machine (a worker_provision_failed
// event fails the check with what the plugin said); no machine fails in
// the 2 s after (each that does is named by worker); Reconcile is
// idempotent; Status; Shutdown returns before its deadline; the process
// exits when go-plugin's GRPCController asks, without being killed;
// nothing is written to stdout after the handshake; every stderr line is
// a log line the host parses; and, with fresh processes, the plugin exits
// within 3 s of SIGTERM and within 4 s of its parent's death, and, given
// a configuration whose machines fail (Config.Failing), a profile whose
// machine failed is answered BACKING_OFF when asked again and listed in
// Status.backing_off.
//
// Provision really provisions: point the plugin at something it may use
// (a sandbox cluster, a test account). The Shutdown near the end cancels
// what the run asked for.
//
// Rejected alternative: the checks as Go test code only, as they were.
// An author in Python could not run them without writing Go, and they
// missed what such plugins get wrong most (no controller, codes without
// details), because a Go plugin gets those from the SDK. The checks
// therefore drive the real host (engine/host.Launch) and look at what it
// sees, plus the two raw processes the host cannot show: one launched
// without the cookie, and one whose parent is killed.
package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/shared"
)

// Config says which plugin to run and how to configure it.
type Config struct {
	// Binary is the plugin executable.
	Binary string
	Args   []string
	Env    []string
	// Name is the provisioner's name; "conformance" if empty.
	Name string
	// HCL is a good configuration: the body of a provisioner block.
	HCL string
	// Invalid lists broken configurations the plugin must reject.
	Invalid []Invalid
	// Failing is a configuration whose machines all fail at once (for a
	// local plugin, worker_command = ["/bin/false"]; for Slurm, a
	// partition that does not exist): the backoff check asks a fresh
	// plugin with it for a machine, waits for the failure, asks again and
	// wants BACKING_OFF. Empty: that check passes saying it was not run.
	Failing string
	// Need is what to Provision; the smallest shape if zero.
	Need shared.Need
	// EventTimeout bounds the wait for the event that follows a
	// Provision; 60 seconds if zero.
	EventTimeout time.Duration
	// Logger receives the plugin's log; the test log in Run, nothing in
	// Check, if nil.
	Logger hclog.Logger
}

// Invalid is a broken configuration and where the plugin must say it is
// broken.
type Invalid struct {
	HCL string
	// Path is the diagnostic's expected path into the JSON configuration.
	Path []string
}

// Result is what one check found.
type Result struct {
	// Check names the check, as Checks lists it.
	Check string `json:"check"`
	Pass  bool   `json:"pass"`
	// Skipped is set when an earlier failure made the check meaningless
	// (no handshake, no schema); such a check does not pass.
	Skipped bool `json:"skipped,omitempty"`
	// Detail says what went wrong, one problem a line.
	Detail  string  `json:"detail,omitempty"`
	Seconds float64 `json:"seconds"`
}

// Checks names the checks in the order they run.
var Checks = []string{
	checkCookie, checkHandshake, checkInfo, checkContract, checkSchema, checkValidate,
	checkPreview, checkNotConfigured, checkConfigure, checkShapes, checkProvision, checkSettled, checkReconcile,
	checkStatus, checkShutdown, checkShutDownDetail, checkController, checkStdout,
	checkLogLines, checkSIGTERM, checkParentDeath, checkBackoff,
}

const (
	checkCookie         = "refuses to start without the magic cookie"
	checkHandshake      = "handshake"
	checkInfo           = "info"
	checkContract       = "contract version"
	checkSchema         = "schema"
	checkValidate       = "validate"
	checkPreview        = "preview answers, or is UNIMPLEMENTED"
	checkNotConfigured  = "error details: NOT_CONFIGURED"
	checkConfigure      = "configure"
	checkShapes         = "shapes and covers agree"
	checkProvision      = "provision"
	checkSettled        = "machines do not fail right after Provision"
	checkReconcile      = "reconcile is idempotent"
	checkStatus         = "status"
	checkShutdown       = "shutdown"
	checkShutDownDetail = "error details: SHUT_DOWN"
	checkController     = "exits on GRPCController.Shutdown"
	checkStdout         = "nothing on stdout after the handshake"
	checkLogLines       = "log lines the host parses"
	checkSIGTERM        = "exits within 3s of SIGTERM"
	checkParentDeath    = "exits within 4s of its parent's death"
	checkBackoff        = "backs off a profile whose machines fail"
)

// Check runs every check against the plugin, calling report once per
// check in the order of Checks, and says whether all passed.
func Check(ctx context.Context, cfg Config, report func(Result)) bool {
	if cfg.Name == "" {
		cfg.Name = "conformance"
	}
	if cfg.EventTimeout == 0 {
		cfg.EventTimeout = 60 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	r := &run{cfg: cfg, report: report, ok: true, events: make(chan shared.Event, 64)}
	r.all(ctx)
	return r.ok
}

// Run runs the checks from a Go test, each as a subtest.
func Run(t *testing.T, cfg Config) {
	t.Helper()
	if cfg.Logger == nil {
		w := &testWriter{t: t}
		defer w.close()
		cfg.Logger = hclog.New(&hclog.LoggerOptions{Output: w, Level: hclog.Info})
	}
	Check(context.Background(), cfg, func(r Result) {
		t.Run(r.Check, func(t *testing.T) {
			switch {
			case r.Skipped:
				t.Skip(r.Detail)
			case !r.Pass:
				t.Error(r.Detail)
			}
		})
	})
}

// problems collects what one check found wrong.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

func (p problems) String() string { return strings.Join(p, "\n") }

// testWriter sends the plugin's log lines to the test log until Run
// returns; go-plugin may log a line after that, and testing panics on a
// Log from a finished test.
type testWriter struct {
	t      *testing.T
	mu     sync.Mutex // guards closed
	closed bool
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimRight(string(b), "\n"))
	}
	return len(b), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
}

// ParseInvalid reads an invalid configuration as the checker's -invalid
// FILE holds it: the body of a provisioner block with a comment line that
// names the path where the plugin must report it,
//
//	# path: profile.0.cpus
//	profile "small" {
//	  cpus = 0
//	}
//
// The path is the diagnostic's path into the JSON configuration, its
// elements joined with dots, or a JSON array of strings for keys that
// hold dots (# path: ["a.b", "0"]); "# path:" alone is the whole
// configuration. "//" works as the comment too.
func ParseInvalid(body string) (Invalid, error) {
	for _, line := range strings.Split(body, "\n") {
		line = strings.TrimSpace(line)
		rest, ok := strings.CutPrefix(line, "#")
		if !ok {
			rest, ok = strings.CutPrefix(line, "//")
		}
		if !ok {
			continue
		}
		value, ok := strings.CutPrefix(strings.TrimSpace(rest), "path:")
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		inv := Invalid{HCL: body, Path: []string{}}
		switch {
		case value == "":
		case strings.HasPrefix(value, "["):
			if err := json.Unmarshal([]byte(value), &inv.Path); err != nil {
				return Invalid{}, fmt.Errorf("the path comment %q is not a JSON array of strings: %v", line, err)
			}
		default:
			inv.Path = strings.Split(value, ".")
		}
		return inv, nil
	}
	return Invalid{}, errors.New(`no comment names the path where the plugin must report the error; add a line such as "# path: profile.0.cpus"`)
}
