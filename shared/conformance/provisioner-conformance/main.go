// Command provisioner-conformance checks a provisioner plugin binary
// against the contract, in any language, without writing Go:
//
//	provisioner-conformance -plugin ./provisioner-mykind -config mykind.hcl [-json]
//
// The configuration file holds the body of the plugin's provisioner block
// (what goes between the braces of `provisioner "mykind" "name" { }`),
// without the engine's own meta-arguments (plugin, sha256). It prints
// one line per check, PASS, FAIL or SKIP with the check's name and what
// went wrong; with -json one JSON object a line instead
// ({"check", "pass", "skipped", "detail", "seconds"}). It exits 0 only
// when every check passed, 1 when one did not, 2 on a usage error.
//
// Provision really provisions: point the plugin at something it may
// use. It lives beside package conformance, whose checks it runs, so
// that the Go kit and this binary cannot drift apart.
package main

import (
	"context"
	"encoding/json"
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
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: provisioner-conformance -plugin BINARY -config FILE [-json] [-name NAME] [-v]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *bin == "" || *config == "" || fs.NArg() != 0 {
		fs.Usage()
		return 2
	}
	body, err := os.ReadFile(*config)
	if err != nil {
		fmt.Fprintf(stderr, "provisioner-conformance: %v\n", err)
		return 2
	}
	logger := hclog.NewNullLogger()
	if *verbose {
		logger = hclog.New(&hclog.LoggerOptions{Output: stderr, Level: hclog.Debug})
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	enc := json.NewEncoder(stdout)
	ok := conformance.Check(ctx, conformance.Config{
		Binary: *bin, Name: *name, HCL: string(body), EventTimeout: *eventTimeout, Logger: logger,
	}, func(r conformance.Result) {
		if *asJSON {
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
		fmt.Fprintln(stdout, line)
	})
	if !ok {
		return 1
	}
	return 0
}
