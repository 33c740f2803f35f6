// Fluksio-worker is the engine kit's worker as a program of its own: the
// payload a provisioner's job runs (worker_command's default). It links
// nothing of the engine, so it is small and has no plugin or HCL code to
// carry onto compute nodes. `make build` puts it in bin/; install it on
// the nodes' PATH, or set worker_command to where it is.
package main

import (
	"os"

	"github.com/fluksio/provision/worker"
)

func main() {
	os.Exit(worker.Main("fluksio-worker", os.Args[1:], os.Stdout, os.Stderr))
}
