// Command provisioner-slurm is the Slurm provisioner as a plugin. A host
// launches it; run by hand it only says so. Everything it does is in
// package slurm; everything it needs to be a plugin is shared.Serve.
package main

import (
	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/plugin"
	"github.com/fluksio/provision/slurm"
)

func main() {
	plugin.Serve(func(log hclog.Logger) shared.Provisioner { return slurm.New(log) })
}
