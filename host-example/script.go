package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/fluksio/provision/engine"

	"github.com/fluksio/provision/engine/hclconfig"
	"github.com/fluksio/provision/engine/host"
)

// scriptMain is the script command: what a provisioner would submit for
// one of its profiles, exactly (for Slurm, the batch script), with the
// credential as a placeholder, the way dask-jobqueue's job_script() shows
// it. It asks the plugin (shared.Previewer); nothing is minted, nothing
// leaves the machine.
func scriptMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("script", flag.ContinueOnError)
	configPath := fs.String("config", "", "the configuration `file` (required)")
	name := fs.String("provisioner", "", "the provisioner block's `name` (required when the file has more than one)")
	profile := fs.String("profile", "", "the `profile` whose script to print (required)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: host-example script -config FILE [-provisioner NAME] -profile P")
		fs.PrintDefaults()
	}
	rest, code, done := parseArgs(fs, args, stdout, stderr)
	if done {
		return code
	}
	switch {
	case len(rest) != 0:
		return usageError(fs, stderr, "takes no arguments, got %q", rest)
	case *configPath == "":
		return usageError(fs, stderr, "-config FILE is required")
	case *profile == "":
		return usageError(fs, stderr, "-profile is required")
	}
	cfg, diags := engine.LoadConfig(*configPath)
	if diags.HasErrors() {
		hclconfig.WriteDiagnostics(stderr, cfg.Files, diags)
		return 1
	}
	var names []string
	var block *host.Block
	for _, p := range cfg.Provisioners {
		names = append(names, p.Name)
		if p.Name == *name || (*name == "" && len(cfg.Provisioners) == 1) {
			block = p
		}
	}
	if block == nil {
		if *name == "" {
			fmt.Fprintf(stderr, "script: %s has %d provisioners (%v); say which with -provisioner NAME\n", *configPath, len(names), names)
			return 2
		}
		slices.Sort(names)
		fmt.Fprintf(stderr, "script: %s has no provisioner %q; it has %v\n", *configPath, *name, names)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	text, diags := host.Preview(ctx, block, *profile)
	hclconfig.SortDiagnostics(diags)
	if len(diags) > 0 {
		hclconfig.WriteDiagnostics(stderr, cfg.Files, diags)
	}
	if diags.HasErrors() {
		return 1
	}
	fmt.Fprint(stdout, text)
	return 0
}
