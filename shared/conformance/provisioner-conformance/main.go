// Command provisioner-conformance checks a provisioner plugin binary, in
// any language, against the contract:
//
//	provisioner-conformance -plugin ./provisioner-mykind -config mykind.hcl [-json]
//	                        [-invalid FILE]... [-failing FILE]
//
// The configuration file holds the body of the plugin's provisioner block
// without the engine's meta-arguments (plugin, sha256). Each -invalid
// FILE is such a body with a mistake and a comment naming the path where
// the plugin must report it ("# path: profile.0.cpus"); -failing FILE is
// a valid one whose machines fail at once, for the backoff check. It prints
// one line per check, PASS, FAIL or SKIP with the check's name and what
// went wrong (-json: one conformance.Result a line), and exits 0 when
// every check passed, 1 when one did not, 2 on a usage error. Provision
// really provisions: point the plugin at something it may use.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/shared/conformance"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("provisioner-conformance", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("plugin", "", "the plugin `binary` to check (required)")
	config := fs.String("config", "", "a `file` holding the body of the plugin's provisioner block (required)")
	name := fs.String("name", "conformance", "the provisioner's `name`; workers are named after it")
	asJSON := fs.Bool("json", false, "one JSON object a line instead of text")
	verbose := fs.Bool("v", false, "show the plugin's log, as the host logs it, on stderr")
	eventTimeout := fs.Duration("event-timeout", time.Minute, "how long to wait for the events that follow Provision")
	var invalidFiles fileList
	fs.Var(&invalidFiles, "invalid", "a `file` holding a broken configuration body and a comment naming the path of the expected diagnostic, such as \"# path: profile.0.cpus\" (repeatable)")
	failing := fs.String("failing", "", "a `file` holding a valid configuration body whose machines fail at once (for a local plugin, worker_command = [\"/bin/false\"]), for the backoff check")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: provisioner-conformance -plugin BINARY -config FILE [-invalid FILE]... [-failing FILE] [-json] [-name NAME] [-v]")
		fs.PrintDefaults()
	}
	// Parse writes its complaint, and the usage, before it returns: held
	// here until it is known whether they answer -h (stdout, exit 0) or a
	// mistake (stderr, exit 2).
	var parseOut strings.Builder
	fs.SetOutput(&parseOut)
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, parseOut.String())
		return 0
	} else if err != nil {
		fmt.Fprint(stderr, parseOut.String())
		return 2
	}
	if *bin == "" || *config == "" || fs.NArg() != 0 {
		fs.Usage()
		return 2
	}
	cfg, err := readInputs(*config, invalidFiles, *failing)
	if err != nil {
		fmt.Fprintf(stderr, "provisioner-conformance: %v\n", err)
		return 2
	}
	cfg.Binary, cfg.Name, cfg.EventTimeout = *bin, *name, *eventTimeout
	cfg.Logger = hclog.NewNullLogger()
	if *verbose {
		cfg.Logger = hclog.New(&hclog.LoggerOptions{Output: stderr, Level: hclog.Debug})
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if !conformance.Check(ctx, cfg, printer(stdout, *asJSON)) {
		return 1
	}
	return 0
}

// readInputs reads the configurations the flags name: the good one
// (-config), the broken ones with the path each must be reported at
// (-invalid), and the failing one (-failing), if given.
func readInputs(config string, invalidFiles []string, failing string) (conformance.Config, error) {
	var cfg conformance.Config
	body, err := os.ReadFile(config)
	if err != nil {
		return cfg, fmt.Errorf("-config: %w", err)
	}
	cfg.HCL = string(body)
	for _, f := range invalidFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return cfg, fmt.Errorf("-invalid: %w", err)
		}
		inv, err := conformance.ParseInvalid(string(b))
		if err != nil {
			return cfg, fmt.Errorf("-invalid %s: %w", f, err)
		}
		cfg.Invalid = append(cfg.Invalid, inv)
	}
	if failing != "" {
		b, err := os.ReadFile(failing)
		if err != nil {
			return cfg, fmt.Errorf("-failing: %w", err)
		}
		cfg.Failing = string(b)
	}
	return cfg, nil
}

// printer writes each check's result to w as it comes: a JSON object a
// line, or PASS, FAIL or SKIP with the check's name, time and detail.
func printer(w io.Writer, asJSON bool) func(conformance.Result) {
	enc := json.NewEncoder(w)
	return func(r conformance.Result) {
		if asJSON {
			_ = enc.Encode(r)
			return
		}
		verdict := "PASS"
		switch {
		case r.Skipped:
			verdict = "SKIP"
		case !r.Pass:
			verdict = "FAIL"
		}
		line := fmt.Sprintf("%s  %s (%.2fs)", verdict, r.Check, r.Seconds)
		if r.Detail != "" {
			line += ": " + strings.ReplaceAll(r.Detail, "\n", "; ")
		}
		fmt.Fprintln(w, line)
	}
}

// fileList collects a repeatable flag's values.
type fileList []string

func (l *fileList) String() string     { return strings.Join(*l, ",") }
func (l *fileList) Set(s string) error { *l = append(*l, s); return nil }
