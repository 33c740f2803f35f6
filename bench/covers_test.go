package bench

//lint:file-ignore SA1019 the measurement compares the deprecated Covers with the cached shapes that replace it

// Measurement 2: "could this provisioner start a machine for the need?"
// asked three ways: the way the host's placer asks (a loop over shapes it
// cached at start-up), the Slurm matcher called in-process, and Covers
// over gRPC to the launched plugin.

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"
	"github.com/fluksio/provision/slurm"
)

// hostCovers is the engine's target.covers (engine/router.go),
// replicated here because it is unexported: any cached shape that fits
// the need.
func hostCovers(shapes []shared.Shape, n shared.Need) bool {
	for _, s := range shapes {
		if s.Fits(n) {
			return true
		}
	}
	return false
}

// coversNeed is covered by the second-smallest of coversProfiles, so
// every matcher looks past at least one profile.
var coversNeed = shared.Need{CPUs: 4, RAMMB: 4000}

// coversProfiles is a site's worth of profiles.
func (e benchEnv) coversProfiles() []map[string]any {
	sb := []string{"--partition=" + e.Partition, "--time=01:00:00"}
	return []map[string]any{
		profile("small", 1, 0, 2000, nil, sb),
		profile("medium", 4, 0, 8000, nil, sb),
		profile("large", 8, 0, 16000, nil, sb),
		profile("highmem", 8, 0, 64000, []string{"bigmem"}, sb),
		profile("gpu1", 4, 1, 16000, []string{"cuda"}, sb),
		profile("gpu2", 8, 2, 32000, []string{"cuda"}, sb),
	}
}

type coversRig struct {
	shapes []shared.Shape
	local  *slurm.Provisioner
	remote shared.Provisioner
}

func newCoversRig(tb testing.TB, e benchEnv) *coversRig {
	tb.Helper()
	name := uniqueName("cov")
	cfg := e.slurmConfig(nil, e.coversProfiles())

	p := launch(tb, e.SlurmBin, name, nil)
	p.configure(tb, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	sh, err := p.prov.Shapes(ctx, &shared.ShapesRequest{})
	if err != nil {
		tb.Fatalf("Shapes: %v", err)
	}

	// The in-process provisioner gets the same configuration, less what
	// its schema lacks, exactly as the plugin did.
	fitted := map[string]any{}
	for k, v := range cfg {
		if p.has(k) {
			fitted[k] = v
		}
	}
	raw, err := json.Marshal(fitted)
	if err != nil {
		tb.Fatal(err)
	}
	local := slurm.New(nil)
	resp, err := local.Configure(ctx, &shared.ConfigureRequest{Name: name, Config: raw, Host: &sharedtest.Host{}})
	if err != nil || resp.Diagnostics.HasErrors() {
		tb.Fatalf("in-process Configure: %v %v", err, resp)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		local.Shutdown(ctx, &shared.ShutdownRequest{})
	})

	r := &coversRig{shapes: sh.Shapes, local: local, remote: p.prov}
	// All three must agree before any is timed.
	lr, err1 := local.Covers(ctx, &shared.CoversRequest{Need: coversNeed})
	rr, err2 := p.prov.Covers(ctx, &shared.CoversRequest{Need: coversNeed})
	if err1 != nil || err2 != nil || !lr.Covered || !rr.Covered || !hostCovers(r.shapes, coversNeed) || lr.Profile != "medium" {
		tb.Fatalf("the matchers disagree: local %+v %v, rpc %+v %v, host %v", lr, err1, rr, err2, hostCovers(r.shapes, coversNeed))
	}
	return r
}

var coversSink bool

func (r *coversRig) host(b *testing.B) {
	for range b.N {
		coversSink = hostCovers(r.shapes, coversNeed)
	}
}

func (r *coversRig) inProcess(b *testing.B) {
	ctx := context.Background()
	req := &shared.CoversRequest{Need: coversNeed}
	for range b.N {
		resp, err := r.local.Covers(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		coversSink = resp.Covered
	}
}

func (r *coversRig) rpc(b *testing.B) {
	ctx := context.Background()
	req := &shared.CoversRequest{Need: coversNeed}
	for range b.N {
		resp, err := r.remote.Covers(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		coversSink = resp.Covered
	}
}

// BenchmarkCovers is one covers question per op, asked three ways.
func BenchmarkCovers(b *testing.B) {
	r := newCoversRig(b, setup(b))
	b.Run("host-cached-shapes", r.host)
	b.Run("in-process", r.inProcess)
	b.Run("rpc", r.rpc)
}
