package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/fluksio/provision/shared/hclconfig"
	"github.com/fluksio/provision/shared/host"
)

// validateMain checks a configuration the way run would read it, without
// asking for anything: it parses the file, launches each plugin, decodes
// the plugin's part of its block against the plugin's schema and lets the
// plugin validate it. Exit 0 when valid, 1 when not, 2 on bad usage.
func validateMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the result as JSON")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: host-example validate [-json] FILE")
		fs.PrintDefaults()
	}
	files, code, done := parseArgs(fs, args, stdout, stderr)
	if done {
		return code
	}
	if len(files) != 1 {
		return usageError(fs, stderr, "want one configuration file, got %d", len(files))
	}
	file := files[0]
	cfg, diags := loadConfig(file)
	if !diags.HasErrors() {
		for _, p := range cfg.Provisioners {
			diags = append(diags, host.Validate(context.Background(), p)...)
		}
	}
	hclconfig.SortDiagnostics(diags)
	if *asJSON {
		if err := hclconfig.WriteDiagnosticsJSON(stdout, diags); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	} else if len(diags) > 0 {
		hclconfig.WriteDiagnostics(stderr, cfg.Files, diags)
	}
	if diags.HasErrors() {
		return 1
	}
	if !*asJSON {
		fmt.Fprintf(stdout, "%s: valid (%d provisioner(s))\n", file, len(cfg.Provisioners))
	}
	return 0
}
