package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/hclconfig"
	"github.com/fluksio/provision/shared/host"
)

// The engine's configuration is HCL:
//
//	engine {
//	  listen     = "127.0.0.1:8470"
//	  plugin_dir = "bin"
//	  secret_env = "FLUKSIO_ENGINE_SECRET"   # optional
//	  tls_cert   = "engine.crt"              # optional, with tls_key
//	  tls_key    = "engine.key"
//	  max_connections = 4096                 # optional
//	}
//	provisioner "slurm" "hpc" {
//	  plugin = "/opt/fluksio/provisioner-slurm"   # optional
//	  sha256 = "…"                                # optional
//	  … everything else belongs to the plugin …
//	}
//
// The engine owns the engine block and a provisioner block's labels and
// meta-arguments; the rest of a provisioner block is decoded against the
// schema its plugin declares, so the engine never learns what a Slurm
// login node is.

const (
	defaultListen    = "127.0.0.1:8470"
	defaultPluginDir = "bin"
)

// metaArguments are the attributes of a provisioner block the engine
// keeps for itself. A plugin's schema may not use these names.
var metaArguments = []string{"plugin", "sha256"}

// validConfigName is what provisioner names and kinds may be: they become
// file names, worker-name prefixes and Slurm job names, so they keep to
// shared.ValidName and start with a letter or digit, because a leading
// '-' or '.' makes a poor file name.
func validConfigName(s string) bool {
	return shared.ValidName(s) && s[0] != '-' && s[0] != '.'
}

// pinRe is a sha256 pin as sha256sum prints it.
var pinRe = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

// engineConfig is the engine block.
type engineConfig struct {
	Listen    string `hcl:"listen,optional"`
	PluginDir string `hcl:"plugin_dir,optional"`
	SecretEnv string `hcl:"secret_env,optional"`
	// TLSCert and TLSKey are PEM files; both or neither (enginetls.go).
	TLSCert string `hcl:"tls_cert,optional"`
	TLSKey  string `hcl:"tls_key,optional"`
	// MaxConnections caps the listener's open connections (listener.go);
	// zero means defaultMaxConnections.
	MaxConnections int `hcl:"max_connections,optional"`
	// ID is the engine's identity (identity.go); empty means derived.
	ID string `hcl:"id,optional"`

	// tlsCert is the loaded pair, nil for plain HTTP.
	tlsCert *tls.Certificate
}

// provisionerConfig is one provisioner block, as far as the engine
// understands it.
type provisionerConfig struct {
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

// config is a whole file.
type config struct {
	Path         string
	Engine       engineConfig
	Provisioners []*provisionerConfig
	// Files holds the parsed sources, so diagnostics can show snippets.
	Files map[string]*hcl.File
}

// loadConfig reads and checks everything the engine itself owns. It runs
// no plugin; see resolveProvisioners for that.
func loadConfig(path string) (*config, hcl.Diagnostics) {
	parser := hclparse.NewParser()
	cfg := &config{Path: path, Files: parser.Files(), Engine: engineConfig{Listen: defaultListen, PluginDir: defaultPluginDir}}
	src, err := readConfigFile(path)
	if err != nil {
		return cfg, hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Configuration file not found",
			Detail:   fmt.Sprintf("Could not read %s: %v. Check the path, or copy config.hcl.example to start one.", path, errors.Unwrap(err)),
		}}
	}
	var file *hcl.File
	// Bounded before any parser sees it: the parsers recurse, and a
	// deep enough file overflows the stack.
	if diags := hclconfig.CheckConfigSource(src, path, strings.HasSuffix(path, ".json")); diags.HasErrors() {
		return cfg, diags
	}
	var diags hcl.Diagnostics
	if strings.HasSuffix(path, ".json") {
		file, diags = parser.ParseJSON(src, path)
	} else {
		file, diags = parser.ParseHCL(src, path)
	}
	if diags.HasErrors() {
		return cfg, diags
	}

	content, more := file.Body.Content(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
		{Type: "engine"},
		{Type: "provisioner", LabelNames: []string{"kind", "name"}},
	}})
	diags = append(diags, more...)

	seenEngine := false
	seen := map[string]*provisionerConfig{}
	for _, block := range content.Blocks {
		switch block.Type {
		case "engine":
			if seenEngine {
				diags = append(diags, &hcl.Diagnostic{
					Severity: hcl.DiagError, Summary: "Duplicate engine block",
					Detail:  "Only one engine block is allowed; merge the two.",
					Subject: block.DefRange.Ptr(),
				})
				continue
			}
			seenEngine = true
			more := gohcl.DecodeBody(block.Body, nil, &cfg.Engine)
			diags = append(diags, more...)
			if !more.HasErrors() {
				diags = append(diags, checkEngineTLS(block, &cfg.Engine, filepath.Dir(path))...)
				diags = append(diags, checkEngineID(block, cfg.Engine.ID)...)
			}
		case "provisioner":
			p, pdiags := loadProvisioner(block, filepath.Dir(path), cfg.Engine.PluginDir)
			diags = append(diags, pdiags...)
			if p == nil {
				continue
			}
			if first, dup := seen[p.Name]; dup {
				diags = append(diags, &hcl.Diagnostic{
					Severity: hcl.DiagError, Summary: "Duplicate provisioner name",
					Detail: fmt.Sprintf("A provisioner named %q is already defined at %s. Names must be unique: they prefix worker names and Slurm job names.",
						p.Name, first.NameRange),
					Subject: p.NameRange.Ptr(),
				})
				continue
			}
			seen[p.Name] = p
			cfg.Provisioners = append(cfg.Provisioners, p)
		}
	}
	if !diags.HasErrors() && len(cfg.Provisioners) == 0 {
		diags = append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagWarning, Summary: "No provisioners",
			Detail:  `Nothing can be provisioned. Add a block such as provisioner "slurm" "hpc" { ... }.`,
			Subject: file.Body.MissingItemRange().Ptr(),
		})
	}
	// plugin_dir may come after the provisioner blocks that use it; the
	// default paths are settled once the whole file has been read.
	for _, p := range cfg.Provisioners {
		if !p.PathExplicit {
			p.Path = pluginPath(filepath.Dir(path), cfg.Engine.PluginDir, p.Kind)
		}
	}
	return cfg, diags
}

func pluginPath(configDir, pluginDir, kind string) string {
	if !filepath.IsAbs(pluginDir) {
		pluginDir = filepath.Join(configDir, pluginDir)
	}
	return filepath.Join(pluginDir, "provisioner-"+kind)
}

func loadProvisioner(block *hcl.Block, configDir, pluginDir string) (*provisionerConfig, hcl.Diagnostics) {
	var diags hcl.Diagnostics
	p := &provisionerConfig{
		Kind: block.Labels[0], Name: block.Labels[1], DefRange: block.DefRange,
		KindRange: block.LabelRanges[0], NameRange: block.LabelRanges[1],
	}
	for _, l := range []struct {
		what, value string
		rng         hcl.Range
	}{{"kind", p.Kind, p.KindRange}, {"name", p.Name, p.NameRange}} {
		if !validConfigName(l.value) {
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
	cfg    *provisionerConfig
	plugin *host.Plugin
	schema *shared.Schema
	json   json.RawMessage
}

// launchOptions are what the run command adds to a launch; validate
// passes none, because it never configures anything.
type launchOptions struct {
	logger  hclog.Logger
	signer  host.CredentialSigner
	onEvent func(shared.Event)
	// engineID and epoch go to every plugin's Configure (identity.go).
	engineID, epoch string
	// dropEnv names variables plugins must not inherit (the secret's).
	dropEnv []string
	// configure says Configure follows at once. It checks everything
	// ValidateConfig would and answers with the same diagnostics, so the
	// extra round trip is skipped at every start and restart.
	configure bool
}

// resolveProvisioners launches each provisioner's plugin, decodes its
// block against the plugin's schema and asks the plugin to validate it.
// It has no side effects beyond starting the plugins: ValidateConfig may
// not touch the cluster. Plugins that started are returned even when
// diagnostics have errors, so the caller can stop them.
func resolveProvisioners(ctx context.Context, cfg *config, opts launchOptions) ([]*launched, hcl.Diagnostics) {
	var diags hcl.Diagnostics
	var out []*launched
	for _, p := range cfg.Provisioners {
		l, pdiags := resolveProvisioner(ctx, p, opts)
		diags = append(diags, pdiags...)
		if l != nil {
			out = append(out, l)
		}
	}
	return out, diags
}

func resolveProvisioner(ctx context.Context, p *provisionerConfig, opts launchOptions) (*launched, hcl.Diagnostics) {
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
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Unknown provisioner kind " + quote(p.Kind), Detail: detail, Subject: at.Ptr()}}
	}
	logger := opts.logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	plugin, err := host.Launch(lctx, host.LaunchConfig{
		Name: p.Name, Path: p.Path, SHA256: p.SHA256, Logger: logger,
		Signer: opts.signer, OnEvent: opts.onEvent, DropEnv: opts.dropEnv,
	})
	if err != nil {
		summary := "Plugin did not start"
		if errors.Is(err, shared.ErrChecksumMismatch) {
			summary, at = "Plugin does not match its sha256 pin", p.SHA256Range
		}
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: summary, Detail: err.Error() + ".", Subject: at.Ptr()}}
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
	if info.Kind != p.Kind {
		return l, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Plugin is of another kind",
			Detail:  fmt.Sprintf("%s says it is a %q provisioner, but this block asks for %q. Fix the block's first label or the plugin path.", p.Path, info.Kind, p.Kind),
			Subject: p.KindRange.Ptr()}}
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
	if opts.configure {
		return l, diags
	}
	vr, err := plugin.Provisioner().ValidateConfig(lctx, &shared.ValidateConfigRequest{Name: p.Name, Config: raw})
	if err != nil {
		return fail("Plugin could not validate its configuration", err)
	}
	return l, append(diags, hclconfig.ConfigDiagnostics(p.Body, sr.Schema, vr.Diagnostics)...)
}

func quote(s string) string { return fmt.Sprintf("%q", s) }

// writeDiagnostics prints each problem as FILE:LINE:COL: summary, then
// hcl's own rendering with the source snippet and the detail.
func writeDiagnostics(w io.Writer, files map[string]*hcl.File, diags hcl.Diagnostics) {
	text := hcl.NewDiagnosticTextWriter(w, files, 100, false)
	for _, d := range diags {
		sev := "error"
		if d.Severity == hcl.DiagWarning {
			sev = "warning"
		}
		if d.Subject != nil {
			fmt.Fprintf(w, "%s:%d:%d: %s: %s\n", d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column, sev, d.Summary)
		} else {
			fmt.Fprintf(w, "%s: %s\n", sev, d.Summary)
		}
		_ = text.WriteDiagnostic(d)
	}
}

// jsonDiagnostic is one problem in validate -json output.
type jsonDiagnostic struct {
	Severity  string `json:"severity"`
	Summary   string `json:"summary"`
	Detail    string `json:"detail,omitempty"`
	Filename  string `json:"filename,omitempty"`
	Line      int    `json:"line,omitempty"`
	Column    int    `json:"column,omitempty"`
	EndLine   int    `json:"end_line,omitempty"`
	EndColumn int    `json:"end_column,omitempty"`
}

func writeDiagnosticsJSON(w io.Writer, diags hcl.Diagnostics) error {
	out := struct {
		Valid       bool             `json:"valid"`
		Diagnostics []jsonDiagnostic `json:"diagnostics"`
	}{Valid: !diags.HasErrors(), Diagnostics: []jsonDiagnostic{}}
	for _, d := range diags {
		j := jsonDiagnostic{Severity: "error", Summary: d.Summary, Detail: d.Detail}
		if d.Severity == hcl.DiagWarning {
			j.Severity = "warning"
		}
		if d.Subject != nil {
			j.Filename, j.Line, j.Column = d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column
			j.EndLine, j.EndColumn = d.Subject.End.Line, d.Subject.End.Column
		}
		out.Diagnostics = append(out.Diagnostics, j)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// sortDiags puts diagnostics in file order, so output reads top to bottom
// whatever order the plugins answered in.
func sortDiags(diags hcl.Diagnostics) {
	sort.SliceStable(diags, func(i, j int) bool {
		a, b := diags[i].Subject, diags[j].Subject
		if a == nil || b == nil {
			return a != nil
		}
		if a.Filename != b.Filename {
			return a.Filename < b.Filename
		}
		return a.Start.Byte < b.Start.Byte
	})
}

// killAll ends every launched plugin without asking it to cancel
// anything; for plugins that were never configured, such as validate's.
func killAll(ls []*launched) {
	for _, l := range ls {
		l.plugin.Kill()
	}
}

// readConfigFile reads at most one byte more than a configuration may
// have, so that a huge file is refused without being read.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, hclconfig.MaxConfigBytes+1))
}
