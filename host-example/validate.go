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
	// found is what each provisioner's preflight learned, by name.
	var found []provisionerFacts
	// v starts each plugin once; with -probe, its plugins learn the value
	// of the engine's run the probe's answer must carry.
	var v host.Validator
	if !diags.HasErrors() && *probe {
		stop, err := cfg.Engine.ServeProbe()
		switch {
		case errors.Is(err, engine.ErrEngineListening):
			held, d := probeHolder(cfg, *timeout)
			diags = append(diags, d...)
			if d.HasErrors() {
				break
			}
			v.Env = []string{shared.ProbeAnswerEnv + "=" + held.Value}
			fmt.Fprintf(stdout, "%s: %s is in use by an engine of this user (%s), which answers the reach probe itself\n",
				termsafe.EscapeLine(file), cfg.Engine.Listen, termsafe.EscapeLine(held.String()))
		case err != nil:
			fmt.Fprintf(stderr, "%s: cannot serve the reach probe's answer at %s: %v\n", termsafe.EscapeLine(file), cfg.Engine.Listen, err)
			return 1
		default:
			v.Env = []string{shared.ProbeAnswerEnv + "=" + engine.ProbeValue()}
			fmt.Fprintf(stdout, "%s: answering the reach probe at %s while it runs; submitting one short job per provisioner\n", termsafe.EscapeLine(file), cfg.Engine.Listen)
			defer stop()
		}
	}
	if !diags.HasErrors() {
		// One plugin process per binary answers for all its blocks.
		for _, p := range cfg.Provisioners {
			if !*preflight {
				diags = append(diags, v.Validate(context.Background(), p)...)
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), *timeout)
			check := v.Check
			if *probe {
				check = v.Probe
			}
			facts, d := check(ctx, p, "")
			cancel()
			diags = append(diags, d...)
			found = append(found, provisionerFacts{Provisioner: p.Name, Kind: p.Kind, Facts: jsonFacts(facts)})
		}
		v.Close()
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
		for _, pf := range found {
			// A plugin's findings are shown escaped (termsafe), as its
			// diagnostics are.
			fmt.Fprintf(stdout, "%s: provisioner %q (%s):\n", termsafe.EscapeLine(file), pf.Provisioner, termsafe.EscapeLine(pf.Kind))
			for _, f := range pf.Facts {
				fmt.Fprintf(stdout, "  %s: %s\n", termsafe.EscapeLine(f.Name), termsafe.EscapeLine(f.Value))
			}
		}
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
