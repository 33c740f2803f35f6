// Host-example is an engine built on shared/host, to run and to copy: it
// launches provisioner plugins (host.Supervisor), keeps the books on the
// workers that attach to it, and hands them work.
//
// It owns what is really an engine's choice: the placer (which
// provisioner is asked for what, and when), the HTTP endpoint workers dial
// back to (listener limits, TLS, GET /status), the worker itself, and the
// CLI with its engine block. What every engine needs (launching,
// supervision, decoding a provisioner block, credentials and admission)
// it takes from shared/host and shared/hclconfig and may not copy: a fix
// there must reach every engine. It never talks to a cluster; only
// plugins do.
//
// Its subcommands are
//
//	host-example worker --url URL --cpus N --gpus N --max-idle SECONDS ...
//
// the payload a provisioner's job runs on the machine it was given (see
// workerMain), and the engine's own commands, which launch plugins.
package main

import (
	"fmt"
	"io"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "worker":
		os.Exit(workerMain(os.Args[2:]))
	case "run":
		os.Exit(runMain(os.Args[2:], os.Stdout, os.Stderr))
	case "validate":
		os.Exit(validateMain(os.Args[2:], os.Stdout, os.Stderr))
	case "help", "-h", "-help", "--help":
		usage(os.Stdout)
	default:
		fmt.Fprintf(os.Stderr, "host-example: unknown command %q\n", os.Args[1])
		usage(os.Stderr)
		os.Exit(2)
	}
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: host-example <command> [flags]

commands:
  run        run the engine: host-example run -config FILE [-need SPEC]... [-timeout D]
  validate   check a configuration: host-example validate [-json] FILE
  worker     run a worker: attach to an engine and take work until idle
`)
}
