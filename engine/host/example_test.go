package host_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"

	"github.com/fluksio/provision/engine/hclconfig"
	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
)

// An engine that builds its own loop on the host side: its own file,
// whose provisioner blocks become launched and configured plugins with
// their shapes, and a signer for the workers that dial back.
// docs/engine-kit.md says when an engine uses this layer directly; the
// kit (package engine) also restarts a plugin that exits, and admits
// each worker only as the job its provisioner said it started.
func Example() {
	const path = "engine.hcl"
	parser := hclparse.NewParser()
	file, diags := parser.ParseHCLFile(path)
	if diags.HasErrors() {
		hclconfig.WriteDiagnostics(os.Stderr, parser.Files(), diags)
		return
	}
	content, _ := file.Body.Content(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
		{Type: "provisioner", LabelNames: []string{"kind", "name"}},
	}})

	secret := host.RandomSecret() // or host.SecretFromEnv("MY_ENGINE_SECRET")
	signer := host.NewSigner(secret)
	ctx := context.Background()
	var plugins []*host.Launched
	for _, block := range content.Blocks {
		b, diags := host.DecodeBlock(block, ".")
		if diags.HasErrors() {
			hclconfig.WriteDiagnostics(os.Stderr, parser.Files(), diags)
			return
		}
		if b.Path == "" {
			b.Path = host.DefaultPluginPath(".", "bin", b.Kind)
		}
		l, diags := host.LaunchBlock(ctx, b, host.LaunchConfig{
			Logger: hclog.Default().Named("plugin"),
			Signer: signer,
			OnEvent: func(ev shared.Event) {
				fmt.Println(ev.Kind, ev.Worker, ev.Job) // which job each worker must attach as
			},
		})
		var shapes []shared.Shape
		if !diags.HasErrors() {
			shapes, diags = l.Configure(ctx, b, &shared.ConfigureRequest{Name: b.Name, Config: l.Config,
				EngineID: host.EngineIdentity("", path), CredentialEpoch: host.CredentialEpoch(secret)})
		}
		if diags.HasErrors() {
			if l != nil {
				l.Kill()
			}
			hclconfig.WriteDiagnostics(os.Stderr, parser.Files(), diags)
			return
		}
		fmt.Println(b.Name, "offers", len(shapes), "shapes")
		plugins = append(plugins, l)
	}

	// ... ask l.Provisioner().Provision for machines; tell it which of
	// its workers are attached (Reconcile, through an AttachedTracker);
	// start it again when l.Exited() is closed; verify a worker's token
	// with signer.Verify, and admit it only as the job its provisioner
	// said it started (the worker_provisioned event) ...

	stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, l := range plugins {
		resp, err := l.Stop(stopCtx) // cancels what the provisioner asked for
		fmt.Println(l.Name(), resp, err)
	}
}
