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
// a Slurm login node is. This file takes a block to a plugin that runs,
// has been checked against its schema and, for the Supervisor, is
// configured and has listed its shapes. The rest of an engine's file (its
// own blocks, where plugins live) is the engine's.

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
	// contract is the contract version the plugin's Info said.
	contract string
}

// Options are what an engine adds to a plugin's launch: every field of
// LaunchConfig but those the block gives (Name, Path, SHA256), so that an
// engine using the Supervisor can set whatever one using Launch can
// (TestOptionsCoverLaunchConfig keeps them in step). Validate needs none
// of them, because it never configures anything.
type Options struct {
	// Logger receives the plugin's own log lines; nil discards them.
	Logger hclog.Logger
	// Args are the plugin's command-line arguments.
	Args []string
	// Signer mints the credentials the plugin asks for (LaunchConfig).
	Signer CredentialSigner
	// MaxCredentialTTL caps what the plugin may ask for; zero means
	// DefaultMaxCredentialTTL.
	MaxCredentialTTL time.Duration
	// OnEvent hears the plugin's events, stamped with its name, as
	// LaunchConfig.OnEvent does; EventQueue bounds what waits for it.
	OnEvent    func(shared.Event)
	EventQueue int
	// EngineID and CredentialEpoch go to every Configure (identity.go).
	EngineID, CredentialEpoch string
	// EngineAddress goes to every Configure: where the engine listens,
	// as network:address, for plugins that carry workers' connections.
	EngineAddress string
	// Env is added to the plugin's environment (LaunchConfig.Env).
	Env []string
	// DropEnv names variables the plugin must not inherit (the secret's).
	DropEnv []string
	// StartTimeout bounds the handshake; zero means 30 seconds.
	StartTimeout time.Duration
	// OnStdout and Stderr are as in LaunchConfig.
	OnStdout func(line string)
	Stderr   io.Writer
}

// launchTimeout bounds a launch with Info and Schema: the handshake's own
// bound, and 30 seconds for the rest.
func (o Options) launchTimeout() time.Duration {
	start := o.StartTimeout
	if start <= 0 {
		start = 30 * time.Second
	}
	return start + 30*time.Second
}

// Validate launches a provisioner's plugin, decodes the block against the
// plugin's schema, asks the plugin to validate it and stops the plugin. It
// has no side effects beyond the plugin's process: ValidateConfig may not
// touch the cluster.
func Validate(ctx context.Context, b *Block) hcl.Diagnostics {
	l, diags := resolve(ctx, b, Options{}, false)
	if l != nil {
		l.plugin.Kill()
	}
	return diags
}

// resolve launches p's plugin and decodes p's body against its schema.
// With configure, Configure follows at once: it checks everything
// ValidateConfig would and answers with the same diagnostics, so the
// extra round trip is skipped at every start and restart. The plugin is
// returned whenever it started, even with errors, so the caller can stop
// it.
func resolve(ctx context.Context, p *Block, opts Options, configure bool) (*launched, hcl.Diagnostics) {
	at := p.DefRange
	if p.PathExplicit {
		at = p.PluginRange
	}
	if _, err := os.Stat(p.Path); err != nil {
		detail := fmt.Sprintf("No plugin for kind %q: looked for %s. Build it (make build), or set plugin = \"/path/to/binary\" in this block.", p.Kind, p.Path)
		if p.PathExplicit {
			detail = fmt.Sprintf("The plugin %s does not exist (%v). Check the path.", p.Path, errors.Unwrap(err))
		} else {
			at = p.KindRange
		}
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Unknown provisioner kind " + strconv.Quote(p.Kind), Detail: detail, Subject: at.Ptr()}}
	}
	logger := opts.Logger
	if logger == nil {
		// Discarded, but at info: the level is what Launch tells the
		// plugin in FLUKSIO_PLUGIN_LOG_LEVEL, which every command that
		// starts a plugin sets (validate, validate -check and script
		// did not, with a null logger's no level).
		logger = hclog.New(&hclog.LoggerOptions{Output: io.Discard, Level: hclog.Info})
	}
	lctx, cancel := context.WithTimeout(ctx, opts.launchTimeout())
	defer cancel()
	// A configured plugin mints within its shapes, once it has listed
	// them (Supervisor.launch).
	plugin, err := launch(lctx, LaunchConfig{
		Name: p.Name, Path: p.Path, SHA256: p.SHA256, Logger: logger, Args: opts.Args,
		Signer: opts.Signer, MaxCredentialTTL: opts.MaxCredentialTTL,
		OnEvent: opts.OnEvent, EventQueue: opts.EventQueue,
		Env: opts.Env, DropEnv: opts.DropEnv, StartTimeout: opts.StartTimeout,
		OnStdout: opts.OnStdout, Stderr: opts.Stderr,
	}, configure)
	if err != nil {
		summary := "Plugin did not start"
		if errors.Is(err, shared.ErrChecksumMismatch) {
			summary, at = "Plugin does not match its sha256 pin", p.SHA256Range
		}
		// Extra carries the error, so that a Supervisor can tell a pin
		// or a protocol mismatch (which no restart fixes) from a crash.
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: summary, Detail: err.Error() + ".", Subject: at.Ptr(), Extra: err}}
	}
	l := &launched{cfg: p, plugin: plugin}
	fail := func(summary string, err error) (*launched, hcl.Diagnostics) {
		return l, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: summary,
			Detail: fmt.Sprintf("%s (%s): %v.", p.Path, plugin.ExitStatus(), err), Subject: at.Ptr()}}
	}
	info, err := plugin.Provisioner().Info(lctx, &shared.InfoRequest{})
	if err != nil {
		return fail("Plugin did not answer Info", err)
	}
	l.contract = info.ContractVersion
	if info.Kind != p.Kind {
		return l, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Plugin is of another kind",
			Detail:  fmt.Sprintf("%s says it is a %q provisioner, but this block asks for %q. Fix the block's first label or the plugin path.", p.Path, info.Kind, p.Kind),
			Subject: p.KindRange.Ptr(), Extra: ErrKindMismatch}}
	}
	sr, err := plugin.Provisioner().Schema(lctx, &shared.SchemaRequest{})
	if err != nil {
		return fail("Plugin did not answer Schema", err)
	}
	if err := sr.Schema.Validate(metaArguments...); err != nil {
		return fail("Plugin has an unusable schema", err)
	}
	l.schema = sr.Schema
	raw, diags := hclconfig.DecodeConfig(p.Body, sr.Schema, nil)
	if diags.HasErrors() {
		return l, diags
	}
	l.json = raw
	if configure {
		return l, diags
	}
	vr, err := plugin.Provisioner().ValidateConfig(lctx, &shared.ValidateConfigRequest{Name: p.Name, Config: raw})
	if err != nil {
		return fail("Plugin could not validate its configuration", err)
	}
	return l, append(diags, hclconfig.ConfigDiagnostics(p.Body, sr.Schema, vr.Diagnostics)...)
}
