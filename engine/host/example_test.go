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

// An engine that embeds the host side: its own file, whose provisioner
// blocks become configured, supervised provisioners with their shapes,
// and a signer for the workers that dial back.
// docs/engine-kit.md says when an engine uses this layer directly.
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
	var sups []*host.Supervisor
	for _, block := range content.Blocks {
		b, diags := host.DecodeBlock(block, ".")
		if diags.HasErrors() {
			hclconfig.WriteDiagnostics(os.Stderr, parser.Files(), diags)
			return
		}
		if b.Path == "" {
			b.Path = host.DefaultPluginPath(".", "bin", b.Kind)
		}
		s := host.NewSupervisor(b, hclog.Default().Named(b.Name), host.Options{
			Signer:          signer,
			EngineID:        host.EngineIdentity("", path),
			CredentialEpoch: host.CredentialEpoch(secret),
			OnEvent: func(ev shared.Event) {
				fmt.Println(ev.Kind, ev.Worker, ev.Job) // which job each worker must attach as
			},
		})
		s.OnUp = func(c host.Configured) { fmt.Println(c.Name, "offers", len(c.Shapes), "shapes") }
		s.OnDown = func(name string) { fmt.Println(name, "is down; it is being restarted") }
		if diags := s.Start(context.Background()); diags.HasErrors() {
			hclconfig.WriteDiagnostics(os.Stderr, parser.Files(), diags)
			return
		}
		sups = append(sups, s)
	}

	// ... ask s.Provisioner().Provision for machines; call s.Reconcile
	// with the workers attached now; verify a worker's token with
	// signer.Verify, and admit it only as the job its provisioner
	// said it started (the worker_provisioned event) ...

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range sups {
		resp, err := s.Shutdown(ctx) // cancels what the provisioner asked for
		fmt.Println(s.Name(), resp, err)
	}
}
