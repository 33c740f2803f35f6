package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"

	"github.com/fluksio/provision/engine/hclconfig"
	"github.com/fluksio/provision/shared"
)

// A provisioner block is the one place where the engine's configuration
// and a plugin's meet:
//
//	provisioner "slurm" "hpc" {
//	  plugin = "/opt/fluksio/provisioner-slurm"   # optional
//	  sha256 = "…"                                # optional
//	  … everything else belongs to the plugin …
//	}
//
// The engine owns the labels and the meta-arguments; the rest is decoded
// against the schema the plugin declares, so the engine never learns what
// a Slurm login node is. The rest of an engine's file (its own blocks,
// where plugins live) is the engine's.

// metaArguments are the attributes of a provisioner block the engine
// keeps for itself. A plugin's schema may not use these names.
var metaArguments = []string{"plugin", "sha256"}

// ValidConfigName reports what provisioner names and kinds may be: they become
// file names, worker-name prefixes and Slurm job names, so they keep to
// shared.ValidName and start with a letter or digit, because a leading
// '-' or '.' makes a poor file name.
func ValidConfigName(s string) bool {
	return shared.ValidName(s) && s[0] != '-' && s[0] != '.'
}

// pinRe is a sha256 pin as sha256sum prints it.
var pinRe = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

// Block is one provisioner block, as far as the engine understands it:
// its labels, its meta-arguments and the rest of its body, which belongs
// to the plugin.
type Block struct {
	Kind string
	Name string
	// Path is the plugin binary: plugin = "…", or plugin_dir/provisioner-<kind>.
	Path string
	// PathExplicit says the path came from plugin = "…".
	PathExplicit bool
	SHA256       string
	// Body is what belongs to the plugin.
	Body hcl.Body

	DefRange, KindRange, NameRange, PluginRange, SHA256Range hcl.Range
}

// DefaultPluginPath is where a provisioner of kind is looked for when its
// block has no plugin = "...": plugin_dir/provisioner-<kind>, plugin_dir
// relative to the configuration file's directory.
func DefaultPluginPath(configDir, pluginDir, kind string) string {
	if !filepath.IsAbs(pluginDir) {
		pluginDir = filepath.Join(configDir, pluginDir)
	}
	return filepath.Join(pluginDir, "provisioner-"+kind)
}

// DecodeBlock reads a provisioner "<kind>" "<name>" block's labels and
// meta-arguments (plugin, sha256). Path is left empty unless the block
// sets plugin; the caller fills in DefaultPluginPath once it knows the
// plugin directory. configDir resolves a relative plugin path.
func DecodeBlock(block *hcl.Block, configDir string) (*Block, hcl.Diagnostics) {
	var diags hcl.Diagnostics
	p := &Block{
		Kind: block.Labels[0], Name: block.Labels[1], DefRange: block.DefRange,
		KindRange: block.LabelRanges[0], NameRange: block.LabelRanges[1],
	}
	for _, l := range []struct {
		what, value string
		rng         hcl.Range
	}{{"kind", p.Kind, p.KindRange}, {"name", p.Name, p.NameRange}} {
		if !ValidConfigName(l.value) {
			diags = append(diags, &hcl.Diagnostic{
				Severity: hcl.DiagError, Summary: "Invalid provisioner " + l.what,
				Detail: fmt.Sprintf("%q is not a valid provisioner %s: use letters, digits, '.', '_' and '-', starting with a letter or digit.",
					l.value, l.what),
				Subject: l.rng.Ptr(),
			})
		}
	}
	meta := &hcl.BodySchema{}
	for _, name := range metaArguments {
		meta.Attributes = append(meta.Attributes, hcl.AttributeSchema{Name: name})
	}
	content, rest, more := block.Body.PartialContent(meta)
	diags = append(diags, more...)
	p.Body = rest
	if attr, ok := content.Attributes["plugin"]; ok {
		p.PluginRange = attr.Expr.Range()
		diags = append(diags, gohcl.DecodeExpression(attr.Expr, nil, &p.Path)...)
		p.PathExplicit = true
		if p.Path == "" {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Empty plugin path",
				Detail: "Give the plugin binary's path, or remove plugin to use plugin_dir/provisioner-<kind>.", Subject: p.PluginRange.Ptr()})
		} else if !filepath.IsAbs(p.Path) {
			p.Path = filepath.Join(configDir, p.Path)
		}
	}
	if attr, ok := content.Attributes["sha256"]; ok {
		p.SHA256Range = attr.Expr.Range()
		diags = append(diags, gohcl.DecodeExpression(attr.Expr, nil, &p.SHA256)...)
		if !pinRe.MatchString(p.SHA256) {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid sha256 pin",
				Detail:  "A pin is the 64 hex digits that sha256sum prints for the plugin binary.",
				Subject: p.SHA256Range.Ptr()})
		}
	}
	if diags.HasErrors() {
		return nil, diags
	}
	return p, diags
}

// launched is a provisioner whose plugin runs and whose block has been
// decoded against the plugin's schema.
type launched struct {
	cfg    *Block
	plugin *Plugin
	schema *shared.Schema
	json   json.RawMessage
	// info is what the plugin's Info said; kind is its Kind.
	info *shared.InfoResponse
	kind string
}

// launchTimeout bounds a launch with Info and Schema: the handshake's own
// bound (start, zero meaning 30 seconds), and 30 seconds for the rest.
func launchTimeout(start time.Duration) time.Duration {
	if start <= 0 {
		start = 30 * time.Second
	}
	return start + 30*time.Second
}

// Launched is a provisioner block's plugin as LaunchBlock leaves it: its
// process running, its Info and Schema read, the block's body decoded
// against the schema, and nothing configured yet.
type Launched struct {
	*Plugin
	// Info is what the plugin's Info said; Schema is its schema.
	Info   *shared.InfoResponse
	Schema *shared.Schema
	// Config is the block's body as JSON, decoded against Schema: the
	// Config of its ConfigureRequest.
	Config json.RawMessage
}

// LaunchBlock launches b's plugin as Launch does, with cfg's Name, Path
// and SHA256 taken from b, asks its Info and Schema, checks that it is
// of b's kind and decodes b's body against its schema, within
// cfg.StartTimeout (zero: 30 seconds) and 30 seconds more. It does not
// ask the plugin to validate b: Configure, which is to follow, answers
// with the same diagnostics. The plugin mints no credential until
// Configure has listed its shapes.
//
// Problems come back as diagnostics against b. A launch that failed
// carries its error in the diagnostic's Extra, and a plugin of another
// kind ErrKindMismatch, so that a caller can tell what no second launch
// fixes (errors.Is: shared.ErrChecksumMismatch, shared.ErrIncompatible,
// ErrKindMismatch) from a crash. The Launched comes back whenever the
// plugin started, with errors or not, so that the caller can stop it.
func LaunchBlock(ctx context.Context, b *Block, cfg LaunchConfig) (*Launched, hcl.Diagnostics) {
	l, diags := resolve(ctx, b, cfg, true)
	if l == nil {
		return nil, diags
	}
	return &Launched{Plugin: l.plugin, Info: l.info, Schema: l.schema, Config: l.json}, diags
}

// Configure sends req to the plugin's Configure and lists its shapes,
// within 30 seconds; req.Config is b's body decoded against Schema, b a
// block of the plugin's kind (its own, or a reload's), and the
// diagnostics point into b. From then on the credentials the plugin
// mints are held to those shapes (hostGuard), as they are after every
// later Configure (a reload, to a plugin that offers
// shared.CapabilityReconfigure).
func (l *Launched) Configure(ctx context.Context, b *Block, req *shared.ConfigureRequest) ([]shared.Shape, hcl.Diagnostics) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p := l.Provisioner()
	cr, err := p.Configure(cctx, req)
	if err != nil {
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Plugin could not be configured",
			Detail: err.Error() + ".", Subject: b.DefRange.Ptr()}}
	}
	diags := hclconfig.ConfigDiagnostics(b.Body, l.Schema, cr.Diagnostics)
	if diags.HasErrors() {
		return nil, diags
	}
	sr, err := p.Shapes(cctx, &shared.ShapesRequest{})
	if err != nil {
		return nil, append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Plugin did not list its shapes",
			Detail: err.Error() + ".", Subject: b.DefRange.Ptr()})
	}
	// The plugin mints within the shapes it listed, before its caller
	// hears it is up and asks it for machines.
	l.guard.limitTo(sr.Shapes)
	return sr.Shapes, diags
}

// Validate launches a provisioner's plugin, decodes the block against the
// plugin's schema, asks the plugin to validate it and stops the plugin. It
// has no side effects beyond the plugin's process: ValidateConfig may not
// touch the cluster. A Validator does the same for many blocks with one
// process per plugin binary.
func Validate(ctx context.Context, b *Block) hcl.Diagnostics {
	var v Validator
	defer v.Close()
	return v.Validate(ctx, b)
}

// resolve launches p's plugin and decodes p's body against its schema.
// With configure, Configure follows at once: it checks everything
// ValidateConfig would and answers with the same diagnostics, so the
// extra round trip is skipped at every start and restart. The plugin is
// returned whenever it started, even with errors, so the caller can stop
// it.
func resolve(ctx context.Context, p *Block, cfg LaunchConfig, configure bool) (*launched, hcl.Diagnostics) {
	if diags := findPlugin(p); diags != nil {
		return nil, diags
	}
	lctx, cancel := context.WithTimeout(ctx, launchTimeout(cfg.StartTimeout))
	defer cancel()
	l, failed := startPlugin(lctx, p, cfg, configure)
	if failed != nil {
		return l, failed(p)
	}
	return l, fitBlock(lctx, l, configure)
}

// PluginAt is where a diagnostic about b's plugin points: its plugin =
// "…" when it has one, else its header.
func (b *Block) PluginAt() hcl.Range {
	if b.PathExplicit {
		return b.PluginRange
	}
	return b.DefRange
}

// findPlugin says, at p's own range, that p's plugin binary is not there;
// nil when it is.
func findPlugin(p *Block) hcl.Diagnostics {
	_, err := os.Stat(p.Path)
	if err == nil {
		return nil
	}
	at := p.PluginAt()
	detail := fmt.Sprintf("No plugin for kind %q: looked for %s. Build it (make build), or set plugin = \"/path/to/binary\" in this block.", p.Kind, p.Path)
	if p.PathExplicit {
		detail = fmt.Sprintf("The plugin %s does not exist (%v). Check the path.", p.Path, errors.Unwrap(err))
	} else {
		at = p.KindRange
	}
	return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Unknown provisioner kind " + strconv.Quote(p.Kind), Detail: detail, Subject: at.Ptr()}}
}

// startPlugin launches p's plugin and asks for its Info and Schema, which
// depend on no block, so one start serves every block that names the
// same binary. When that fails, failed renders the failure at the range of
// any such block; the plugin is returned whenever it started, so the
// caller can stop it. With shapesFirst the plugin may mint only once its
// shapes are known (a block that is configured next); without, it only
// validates.
func startPlugin(ctx context.Context, p *Block, cfg LaunchConfig, shapesFirst bool) (l *launched, failed func(*Block) hcl.Diagnostics) {
	if cfg.Logger == nil {
		// Discarded, but at info: the level is what Launch tells the
		// plugin in FLUKSIO_PLUGIN_LOG_LEVEL, which every command that
		// starts a plugin sets (validate, validate -check and script
		// did not, with a null logger's no level).
		cfg.Logger = hclog.New(&hclog.LoggerOptions{Output: io.Discard, Level: hclog.Info})
	}
	// A plugin that is configured next mints within its shapes, once it
	// has listed them (Launched.Configure); one that only validates mints
	// nothing.
	cfg.Name, cfg.Path, cfg.SHA256 = p.Name, p.Path, p.SHA256
	plugin, err := launch(ctx, cfg, shapesFirst)
	if err != nil {
		return nil, func(b *Block) hcl.Diagnostics {
			summary, at := "Plugin did not start", b.PluginAt()
			if errors.Is(err, shared.ErrChecksumMismatch) {
				summary, at = "Plugin does not match its sha256 pin", b.SHA256Range
			}
			// Launch's error names the block that started the binary; a
			// Validator shows it for every block of that binary, each
			// under its own name.
			detail := err.Error()
			if rest, ok := strings.CutPrefix(detail, fmt.Sprintf("provisioner %q: ", p.Name)); ok {
				detail = fmt.Sprintf("provisioner %q: %s", b.Name, rest)
			}
			// Extra carries the error, so that a supervisor can tell a pin
			// or a protocol mismatch (which no restart fixes) from a crash.
			return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: summary, Detail: detail + ".", Subject: at.Ptr(), Extra: err}}
		}
	}
	l = &launched{cfg: p, plugin: plugin}
	fail := func(summary string, err error) (*launched, func(*Block) hcl.Diagnostics) {
		status := plugin.ExitStatus().String() // as it was then, before anyone stops it
		return l, func(b *Block) hcl.Diagnostics { return pluginFailed(b, status, summary, err) }
	}
	info, err := plugin.Provisioner().Info(ctx, &shared.InfoRequest{})
	if err != nil {
		return fail("Plugin did not answer Info", err)
	}
	l.info, l.kind = info, info.Kind
	sr, err := plugin.Provisioner().Schema(ctx, &shared.SchemaRequest{})
	if err != nil {
		return fail("Plugin did not answer Schema", err)
	}
	if err := sr.Schema.Validate(metaArguments...); err != nil {
		return fail("Plugin has an unusable schema", err)
	}
	l.schema = sr.Schema
	return l, nil
}

// pluginFailed is a diagnostic at b's plugin range saying that its
// plugin failed at summary, and how its process stood (ExitStatus).
func pluginFailed(b *Block, status, summary string, err error) hcl.Diagnostics {
	return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: summary,
		Detail: fmt.Sprintf("%s (%s): %v.", b.Path, status, err), Subject: b.PluginAt().Ptr()}}
}

// fitBlock checks that l's plugin is of the kind l's block asks for,
// decodes the block's body against the plugin's schema into l.json and,
// unless the caller configures next, asks the plugin to validate it.
func fitBlock(ctx context.Context, l *launched, configure bool) hcl.Diagnostics {
	p := l.cfg
	if l.kind != p.Kind {
		return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Plugin is of another kind",
			Detail:  fmt.Sprintf("%s says it is a %q provisioner, but this block asks for %q. Fix the block's first label or the plugin path.", p.Path, l.kind, p.Kind),
			Subject: p.KindRange.Ptr(), Extra: ErrKindMismatch}}
	}
	raw, diags := hclconfig.DecodeConfig(p.Body, l.schema, nil)
	if diags.HasErrors() {
		return diags
	}
	l.json = raw
	if configure {
		return diags
	}
	vr, err := l.plugin.Provisioner().ValidateConfig(ctx, &shared.ValidateConfigRequest{Name: p.Name, Config: raw})
	if err != nil {
		return pluginFailed(p, l.plugin.ExitStatus().String(), "Plugin could not validate its configuration", err)
	}
	return append(diags, hclconfig.ConfigDiagnostics(p.Body, l.schema, vr.Diagnostics)...)
}
