package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
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
	// probeEnv tells the plugins, with -probe, the value of the engine's
	// run that the probe's answer must carry.
	var probeEnv []string
	if !diags.HasErrors() && *probe {
		stop, env, d, ok := serveProbe(file, cfg, *timeout, stdout, stderr)
		if !ok {
			return 1
		}
		defer stop()
		diags = append(diags, d...)
		probeEnv = env
	}
	// found is what each provisioner's preflight learned, by name.
	var found []provisionerFacts
	if !diags.HasErrors() {
		var d hcl.Diagnostics
		d, found = checkProvisioners(cfg, *preflight, *probe, *timeout, probeEnv)
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
// while validate -probe runs, unless an engine of this user there
// answers it; stop ends it. env is what the plugins are given so that
// the probe's worker knows the answer of this run; diags says who holds
// the port when it is not an engine of ours. ok is false when it can do
// neither, said on stderr.
func serveProbe(file string, cfg *engine.File, timeout time.Duration, stdout, stderr io.Writer) (stop func(), env []string, diags hcl.Diagnostics, ok bool) {
	stop, err := cfg.Engine.ServeProbe()
	switch {
	case errors.Is(err, engine.ErrEngineListening):
		held, d := probeHolder(cfg, timeout)
		if d.HasErrors() {
			return func() {}, nil, d, true
		}
		fmt.Fprintf(stdout, "%s: %s is in use by an engine of this user (%s), which answers the reach probe itself\n",
			termsafe.EscapeLine(file), cfg.Engine.Listen, termsafe.EscapeLine(held.String()))
		return func() {}, []string{shared.ProbeAnswerEnv + "=" + held.Value}, d, true
	case err != nil:
		fmt.Fprintf(stderr, "%s: cannot serve the reach probe's answer at %s: %v\n", termsafe.EscapeLine(file), cfg.Engine.Listen, err)
		return nil, nil, nil, false
	}
	fmt.Fprintf(stdout, "%s: answering the reach probe at %s while it runs; submitting one short job per provisioner\n", termsafe.EscapeLine(file), cfg.Engine.Listen)
	return stop, []string{shared.ProbeAnswerEnv + "=" + engine.ProbeValue()}, nil, true
}

// checkProvisioners validates each provisioner block, or with preflight
// runs its check (with probe, its reach probe), each within timeout. One
// plugin process per binary answers for all its blocks.
func checkProvisioners(cfg *engine.File, preflight, probe bool, timeout time.Duration, env []string) (diags hcl.Diagnostics, found []provisionerFacts) {
	v := host.Validator{Env: env}
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

// probeHolder says what holds the engine's address when validate cannot
// serve the probe's answer there: an engine of this user, whose value of
// the run the probe's worker must then find, or an error at listen that
// says who holds it and what it answered. A probe that reached another
// user's server would say nothing of the engine.
func probeHolder(cfg *engine.File, timeout time.Duration) (engine.ProbeHolder, hcl.Diagnostics) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	held, err := cfg.Engine.WhoAnswers(ctx)
	fail := func(summary, format string, args ...any) (engine.ProbeHolder, hcl.Diagnostics) {
		return held, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: summary, Detail: fmt.Sprintf(format, args...), Subject: cfg.Engine.ListenAt()}}
	}
	switch {
	case err != nil:
		return fail("Reach probe not run", "%s is in use, and what holds it cannot be told: %v. The probe would not know what it reached: stop what listens there, or run the engine and check again.", cfg.Engine.Listen, err)
	case held.UID != os.Getuid():
		return fail("Engine address held by another user",
			"%s is held by %s, not by this engine's user (uid %d). A probe from a compute node would reach it, not the engine, so none is submitted. Stop it, or move listen and engine_url to a port nobody else holds.",
			cfg.Engine.Listen, held, os.Getuid())
	case held.Value == "":
		return fail("Engine address held by something else",
			"%s is held by %s, not as an engine answers. A probe from a compute node would reach it, not the engine, so none is submitted. Stop it, or move listen and engine_url to a free port.",
			cfg.Engine.Listen, held)
	}
	return held, nil
}
