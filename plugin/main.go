// Command provisioner-slurm is the Slurm provisioner as a plugin. A host
// launches it; run by hand it only says so. Everything it does is in
// package slurm; everything it needs to be a plugin is shared.Serve.
//
// Run as "provisioner-slurm relay ..." on a login node, it is the relay
// that carries workers' connections to the engine (reach = "relay").
package main

import (
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/plugin"
	"github.com/fluksio/provision/slurm"
	"github.com/fluksio/provision/slurm/relay"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "relay" {
		os.Exit(relay.Main(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	plugin.Serve(func(log hclog.Logger) shared.Provisioner { return slurm.New(log) },
		plugin.WithUsage(relay.Usage))
}
