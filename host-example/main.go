// Host-example is an engine built on the engine kit (engine), to run and
// to copy. It owns what is an engine's own choice: the CLI (run, validate,
// script, worker, version), the operator's authentication in front of the
// kit's /status, event stream and metrics, the status page, the story
// told on stdout, and keeping the signing secret out of its own
// environment (run re-executes itself without it). What every engine
// needs it takes from the kit and never copies, and it never talks to a
// cluster; only plugins do. `host-example worker` is the payload a
// provisioner's job runs (worker.Main).
//
// Design records: docs/design/host-example-cli.md,
// docs/design/host-example-page.md, docs/design/host-example-operator.md,
// docs/design/host-example-secrets.md.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/fluksio/provision/worker"

	"github.com/fluksio/provision/internal/buildinfo"
)

// commands are host-example's subcommands, in the order help lists them.
// Each takes its arguments and its output streams and returns the exit
// code: 0 done, 1 the work failed, 2 the command line was wrong.
var commands = []struct {
	name, synopsis string
	main           func(args []string, stdout, stderr io.Writer) int
}{
	{"run", "run the engine: host-example run -config FILE [-need SPEC]... [-tasks FILE -results DIR] [-v] [-timeout D]", runMain},
	{"status", "print a running engine's status: host-example status [-watch PERIOD] URL", statusMain},
	{"validate", "check a configuration: host-example validate [-check] [-json] FILE", validateMain},
	{"script", "print the batch script a profile would submit: host-example script -config FILE [-provisioner NAME] -profile P", scriptMain},
	{"worker", "run a worker (as fluksio-worker): attach to an engine and take work until idle", func(args []string, stdout, stderr io.Writer) int {
		return worker.Main("host-example worker", args, stdout, stderr)
	}},
	{"version", "print the version and the build's revision", versionMain},
}

func main() {
	reexecAllowed = true // see secrets.go
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

// cli runs the command args name. Help, asked for, goes to stdout and
// exits 0; a mistake goes to stderr with the usage and exits 2.
func cli(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			// "help run" is "run -h".
			return cli([]string{args[1], "-h"}, stdout, stderr)
		}
		usage(stdout)
		return 0
	case "-version", "--version":
		return versionMain(nil, stdout, stderr)
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.main(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "host-example: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprint(w, "usage: host-example <command> [flags]\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s  %s\n", c.name, c.synopsis)
	}
	fmt.Fprint(w, "\nEvery command takes -h. host-example --version is host-example version.\n")
}

// versionMain prints which build this is: the module's version and the
// VCS revision the toolchain stamped into the binary.
func versionMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
			fmt.Fprintln(stdout, "usage: host-example version\n\nPrints the module version, the VCS revision and the Go toolchain this binary was built with.")
			return 0
		}
		fmt.Fprintf(stderr, "version: takes no arguments, got %q\n", args)
		return 2
	}
	fmt.Fprintln(stdout, buildinfo.Read().Line("host-example"))
	return 0
}
