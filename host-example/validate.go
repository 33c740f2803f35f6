package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/internal/termsafe"

	"github.com/fluksio/provision/shared"

	"github.com/fluksio/provision/engine/hclconfig"
	"github.com/fluksio/provision/engine/host"
)

// validateMain checks a configuration the way run would read it, without
// asking for anything: it parses the file, launches each plugin binary
// once, decodes each block's part for the plugin against the plugin's
// schema and lets the plugin validate it. That has no side effects: no
// network, no jobs.
//
// With -check it then runs each plugin's preflight (shared.Checker)
// against the system the block names, over the block's real settings and
// bounded by -check-timeout: for Slurm, the login, the Slurm version and
// MaxArraySize, the worker command, and sbatch --test-only for every
// profile. Still nothing is submitted.
//
// -probe (with -check) adds the reach probe, the one check that submits a
// job: a short job of each provisioner's first profile whose worker asks
// engine_url, from a compute node, whether the engine answers there.
// Meanwhile validate serves the engine's probe answer where the engine
// block says it listens, unless something listens there already (a
// running engine answers it too). Exit 0 when valid, 1 when not, 2 on
// bad usage.
func validateMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the result as JSON")
	preflight := fs.Bool("check", false, "also check each provisioner against its real system (login, versions, sbatch --test-only); submits nothing")
	timeout := fs.Duration("check-timeout", 2*time.Minute, "bound on each provisioner's -check")
	probe := fs.Bool("probe", false, "with -check: also submit one short job per provisioner whose worker checks, from a compute node, that engine_url reaches the engine (the only check that submits anything)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: host-example validate [-check [-probe]] [-json] FILE")
		fs.PrintDefaults()
	}
	files, code, done := parseArgs(fs, args, stdout, stderr)
	if done {
		return code
	}
	if len(files) != 1 {
		return usageError(fs, stderr, "want one configuration file, got %d", len(files))
	}
	if *probe && !*preflight {
		return usageError(fs, stderr, "-probe goes with -check")
	}
	file := files[0]
	cfg, diags := engine.LoadConfig(file)
	if !diags.HasErrors() && *probe {
		stop, ok := serveProbe(file, cfg, stdout, stderr)
		if !ok {
			return 1
		}
		defer stop()
	}
	// found is what each provisioner's preflight learned, by name.
	var found []provisionerFacts
	if !diags.HasErrors() {
		var d hcl.Diagnostics
		d, found = checkProvisioners(cfg, *preflight, *probe, *timeout)
		diags = append(diags, d...)
	}
	hclconfig.SortDiagnostics(diags)
	if *asJSON {
		var extra any
		if *preflight {
			extra = found
		}
		if err := hclconfig.WritePreflightJSON(stdout, diags, extra); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	} else {
		writeFacts(stdout, file, found)
		if len(diags) > 0 {
			hclconfig.WriteDiagnostics(stderr, cfg.Files, diags)
		}
	}
	if diags.HasErrors() {
		return 1
	}
	if !*asJSON {
		what := "valid"
		if *preflight {
			what = "valid, and the preflight passed"
		}
		fmt.Fprintf(stdout, "%s: %s (%d provisioner(s))\n", termsafe.EscapeLine(file), what, len(cfg.Provisioners))
	}
	return 0
}

// serveProbe answers the reach probe where the engine would listen,
// while validate -probe runs, unless an engine there answers it; stop
// ends it. ok is false when it can do neither, said on stderr.
func serveProbe(file string, cfg *engine.File, stdout, stderr io.Writer) (stop func(), ok bool) {
	stop, err := cfg.Engine.ServeProbe()
	switch {
	case errors.Is(err, engine.ErrEngineListening):
		fmt.Fprintf(stdout, "%s: %s is in use, most likely by the engine, which answers the reach probe itself\n", termsafe.EscapeLine(file), cfg.Engine.Listen)
		return func() {}, true
	case err != nil:
		fmt.Fprintf(stderr, "%s: cannot serve the reach probe's answer at %s: %v\n", termsafe.EscapeLine(file), cfg.Engine.Listen, err)
		return nil, false
	}
	fmt.Fprintf(stdout, "%s: answering the reach probe at %s while it runs; submitting one short job per provisioner\n", termsafe.EscapeLine(file), cfg.Engine.Listen)
	return stop, true
}

// checkProvisioners validates each provisioner block, or with preflight
// runs its check (with probe, its reach probe), each within timeout. One
// plugin process per binary answers for all its blocks.
func checkProvisioners(cfg *engine.File, preflight, probe bool, timeout time.Duration) (diags hcl.Diagnostics, found []provisionerFacts) {
	var v host.Validator
	defer v.Close()
	for _, p := range cfg.Provisioners {
		if !preflight {
			diags = append(diags, v.Validate(context.Background(), p)...)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		check := v.Check
		if probe {
			check = v.Probe
		}
		facts, d := check(ctx, p, "")
		cancel()
		diags = append(diags, d...)
		found = append(found, provisionerFacts{Provisioner: p.Name, Kind: p.Kind, Facts: jsonFacts(facts)})
	}
	return diags, found
}

// writeFacts prints each provisioner's preflight findings, escaped
// (termsafe) as its diagnostics are.
func writeFacts(w io.Writer, file string, found []provisionerFacts) {
	for _, pf := range found {
		fmt.Fprintf(w, "%s: provisioner %q (%s):\n", termsafe.EscapeLine(file), pf.Provisioner, termsafe.EscapeLine(pf.Kind))
		for _, f := range pf.Facts {
			fmt.Fprintf(w, "  %s: %s\n", termsafe.EscapeLine(f.Name), termsafe.EscapeLine(f.Value))
		}
	}
}

// provisionerFacts is one provisioner's preflight findings, as -json
// prints them.
type provisionerFacts struct {
	Provisioner string     `json:"provisioner"`
	Kind        string     `json:"kind"`
	Facts       []jsonFact `json:"facts"`
}

type jsonFact struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	Path  string `json:"path,omitempty"`
}

func jsonFacts(facts []shared.Fact) []jsonFact {
	out := []jsonFact{}
	for _, f := range facts {
		out = append(out, jsonFact{Name: f.Name, Value: f.Value, Path: strings.Join(f.Path, ".")})
	}
	return out
}
