package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/engine/hclconfig"
)

// reloadTimeout bounds one reload: launching an added provisioner's
// plugin, configuring the changed ones again.
const reloadTimeout = 2 * time.Minute

// reloadOn reloads the configuration file on each signal from hup, on a
// goroutine of its own, until ctx ends or the returned stop is called
// (which waits for it, and for a reload under way). A file that cannot
// be read, or that the engine refuses, is told with its diagnostics
// (file:line:col) on errOut and in the log, and the engine runs on as
// before; one applied is logged a line per change by the engine, and
// said in the story.
func (d *daemon) reloadOn(ctx context.Context, hup <-chan os.Signal, errOut io.Writer) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				d.reload(ctx, errOut)
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			wg.Wait()
		})
	}
}

// reload reads the configuration file again and has the engine apply it.
func (d *daemon) reload(ctx context.Context, errOut io.Writer) {
	d.logger.Info("SIGHUP: reloading the configuration", "file", d.cfg.Path)
	next, diags := engine.LoadConfig(d.cfg.Path)
	if diags.HasErrors() {
		d.logger.Error("configuration reload refused: the file has errors; the running configuration is kept",
			"file", d.cfg.Path, "at", firstAt(diags), "errors", len(diags.Errs()), "generation", d.eng.Config().Generation)
		hclconfig.SortDiagnostics(diags)
		hclconfig.WriteDiagnostics(errOut, next.Files, diags)
		d.story.say("configuration reload refused (see the diagnostics); still running configuration %d", d.eng.Config().Generation)
		return
	}
	rctx, cancel := context.WithTimeout(ctx, reloadTimeout)
	defer cancel()
	r, more := d.eng.Reload(rctx, d.cfg, next)
	diags = append(diags, more...)
	if len(diags) > 0 {
		hclconfig.SortDiagnostics(diags)
		hclconfig.WriteDiagnostics(errOut, next.Files, diags)
	}
	if more.HasErrors() {
		d.logger.Error("configuration reload refused; the running configuration is kept",
			"file", d.cfg.Path, "at", firstAt(more), "errors", len(more.Errs()), "generation", d.eng.Config().Generation)
		d.story.say("configuration reload refused (see the diagnostics); still running configuration %d", d.eng.Config().Generation)
		return
	}
	d.cfg = next
	d.story.say("configuration reloaded: generation %d (%s), %d change(s)", r.Generation, r.Digest, len(r.Changes))
}

// firstAt is where the first error of diags points, as file:line:col;
// empty when it points nowhere.
func firstAt(diags hcl.Diagnostics) string {
	for _, d := range diags {
		if d.Severity == hcl.DiagError && d.Subject != nil {
			return fmt.Sprintf("%s:%d:%d", d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column)
		}
	}
	return ""
}
