package engine

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/zclconf/go-cty/cty"

	"github.com/fluksio/provision/engine/hclconfig"
	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/fileperm"
)

// The engine's configuration is HCL:
//
//	engine {
//	  listen     = "127.0.0.1:8470"                # or "unix:/run/fluksio/engine.sock"
//	  plugin_dir = "bin"
//	  secret_env = "FLUKSIO_ENGINE_SECRET"   # optional
//	  tls_cert   = "engine.crt"              # optional, with tls_key
//	  tls_key    = "engine.key"
//	  max_connections = 4096                 # optional
//	  operator_token_env = "FLUKSIO_OPERATOR_TOKEN"  # optional
//	  open_metrics = false                   # optional
//	  operator_hosts = ["engine.example"]    # optional
//	  park_polls = true                      # optional
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

// EngineBlock is the engine block.
type EngineBlock struct {
	Listen    string `hcl:"listen,optional"`
	PluginDir string `hcl:"plugin_dir,optional"`
	SecretEnv string `hcl:"secret_env,optional"`
	// TLSCert and TLSKey are PEM files; both or neither (tlsconfig.go).
	TLSCert string `hcl:"tls_cert,optional"`
	TLSKey  string `hcl:"tls_key,optional"`
	// MaxConnections caps the listener's open connections (listener.go);
	// zero means defaultMaxConnections.
	MaxConnections int `hcl:"max_connections,optional"`
	// ID is the engine's identity; empty means derived (host.EngineIdentity).
	ID string `hcl:"id,optional"`
	// OperatorTokenEnv names the variable holding the operator's token
	// (host-example/operator.go); empty means operators on loopback alone.
	OperatorTokenEnv string `hcl:"operator_token_env,optional"`
	// OpenMetrics serves GET /metrics to anyone, without the token.
	OpenMetrics bool `hcl:"open_metrics,optional"`
	// OperatorHosts are names (host or host:port) the operator's
	// endpoints answer besides the listen address (Config.OperatorHosts).
	OperatorHosts []string `hcl:"operator_hosts,optional"`
	// ParkPolls parks the workers' long polls (engine/internal/park);
	// false holds each as a net/http handler (Config.HoldPolls). True
	// unless the block says otherwise.
	ParkPolls bool `hcl:"park_polls,optional"`

	// loadedCert is the loaded pair, nil for plain HTTP.
	loadedCert *tls.Certificate
	// listenAt is where listen is set; nil when it is not.
	listenAt *hcl.Range
}

// ListenAt is where the file sets listen, for a diagnostic about the
// address; nil when the file leaves it to the default.
func (e *EngineBlock) ListenAt() *hcl.Range { return e.listenAt }

// File is a whole file.
type File struct {
	Path string
	// Digest is the first 12 hex digits of the sha256 of the file's
	// bytes: which configuration an engine runs, as GET /status says.
	Digest       string
	Engine       EngineBlock
	Provisioners []*host.Block
	// Files holds the parsed sources, so diagnostics can show snippets.
	Files map[string]*hcl.File
}

// LoadConfig reads and checks everything the engine itself owns. It runs
// no plugin; see resolveProvisioners for that.
func LoadConfig(path string) (*File, hcl.Diagnostics) {
	parser := hclparse.NewParser()
	cfg := &File{Path: path, Files: parser.Files(), Engine: EngineBlock{Listen: defaultListen, PluginDir: defaultPluginDir, ParkPolls: true}}
	file, diags := hclconfig.ParseFile(parser, path)
	if file != nil {
		sum := sha256.Sum256(file.Bytes)
		cfg.Digest = hex.EncodeToString(sum[:])[:12]
	}
	if diags.HasErrors() {
		if file == nil && len(diags) == 1 && diags[0].Summary == "Configuration file not found" {
			diags[0].Detail += " To start one, copy config.hcl.example."
		}
		return cfg, diags
	}

	content, more := file.Body.Content(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
		{Type: "engine"},
		{Type: "provisioner", LabelNames: []string{"kind", "name"}},
	}})
	diags = append(diags, more...)

	seenEngine := false
	seen := map[string]*host.Block{}
	// pluginDirAt is where plugin_dir is set, for a diagnostic about a
	// plugin found there.
	var pluginDirAt *hcl.Range
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
			attrs, _ := block.Body.JustAttributes()
			if attrs["plugin_dir"] != nil {
				pluginDirAt = attrs["plugin_dir"].Expr.Range().Ptr()
			}
			if attrs["listen"] != nil {
				cfg.Engine.listenAt = attrs["listen"].Expr.Range().Ptr()
			}
			if !more.HasErrors() {
				diags = append(diags, checkEngineTLS(block, &cfg.Engine, filepath.Dir(path))...)
				diags = append(diags, checkEngineID(block, cfg.Engine.ID)...)
				diags = append(diags, checkEngineListen(block, cfg.Engine.Listen)...)
				diags = append(diags, checkOperatorConfig(block, &cfg.Engine)...)
			}
		case "provisioner":
			p, pdiags := host.DecodeBlock(block, filepath.Dir(path))
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
	if !diags.HasErrors() {
		for _, p := range cfg.Provisioners {
			diags = append(diags, checkEngineURL(p, cfg.Engine.Listen)...)
		}
	}
	// plugin_dir may come after the provisioner blocks that use it; the
	// default paths are settled once the whole file has been read.
	for _, p := range cfg.Provisioners {
		if !p.PathExplicit {
			p.Path = host.DefaultPluginPath(filepath.Dir(path), cfg.Engine.PluginDir, p.Kind)
		}
	}
	diags = append(diags, checkWhatRuns(path, cfg.Provisioners, pluginDirAt)...)
	return cfg, diags
}

// checkWhatRuns refuses a configuration file, or a plugin binary it
// names, that someone other than the engine's user or root can change
// (internal/fileperm's rule): whoever can write the file decides what the
// engine runs, as the engine's user, at the next start or SIGHUP. The
// diagnostic about the file is at its first line; about a plugin, at the
// plugin attribute, or at plugin_dir, or at the block. A pinned plugin is
// refused too: its pin holds the bytes, but the rule is one for every
// file that decides what runs.
func checkWhatRuns(path string, provisioners []*host.Block, pluginDirAt *hcl.Range) hcl.Diagnostics {
	var diags hcl.Diagnostics
	if p := fileperm.Check(path); p != nil {
		at := hcl.Pos{Line: 1, Column: 1, Byte: 0}
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Configuration file others can write",
			Detail:  fmt.Sprintf("%s. Whoever can change this file decides what the engine runs, as the engine's user. Fix: %s.", p.Why, p.Fix),
			Subject: &hcl.Range{Filename: path, Start: at, End: at}})
	}
	for _, b := range provisioners {
		p := fileperm.Check(b.Path)
		if p == nil {
			continue
		}
		subject := b.DefRange.Ptr()
		switch {
		case b.PathExplicit:
			subject = b.PluginRange.Ptr()
		case pluginDirAt != nil:
			subject = pluginDirAt
		}
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Plugin others can write",
			Detail: fmt.Sprintf("Provisioner %q runs a plugin that others can change: %s. Whoever can change it runs their program as the engine's user. Fix: %s.",
				b.Name, p.Why, p.Fix),
			Subject: subject})
	}
	return diags
}

// checkEngineID validates engine { id }.
func checkEngineID(block *hcl.Block, id string) hcl.Diagnostics {
	if id == "" {
		return nil
	}
	if host.ValidEngineID(id) {
		return nil
	}
	var subject *hcl.Range
	if attrs, _ := block.Body.JustAttributes(); attrs["id"] != nil {
		subject = attrs["id"].Expr.Range().Ptr()
	} else {
		subject = block.DefRange.Ptr()
	}
	return hcl.Diagnostics{{
		Severity: hcl.DiagError, Summary: "Invalid engine id",
		Detail: fmt.Sprintf("%q is not an engine id. Use 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit, such as \"prod\" or \"staging-eu\"; plugins tag what they create with it.",
			id, host.MaxEngineIDLen),
		Subject: subject,
	}}
}

// checkEngineListen validates engine { listen }: host:port, or unix:PATH
// for a socket that only this user (and a relaying plugin) can reach.
func checkEngineListen(block *hcl.Block, listen string) hcl.Diagnostics {
	var detail string
	if path, ok := strings.CutPrefix(listen, "unix:"); ok {
		switch {
		case path == "":
			detail = `"unix:" needs a path, such as "unix:/run/fluksio/engine.sock".`
		case len(path) > 100:
			detail = fmt.Sprintf("the socket path is %d bytes long; a unix socket's path must stay under 108 bytes. Choose a shorter one.", len(path))
		}
	} else if _, port, err := net.SplitHostPort(listen); err != nil || port == "" {
		detail = fmt.Sprintf("%q is neither host:port (such as \"127.0.0.1:8470\") nor unix:PATH (such as \"unix:/run/fluksio/engine.sock\").", listen)
	}
	if detail == "" {
		return nil
	}
	subject := block.DefRange.Ptr()
	if attrs, _ := block.Body.JustAttributes(); attrs["listen"] != nil {
		subject = attrs["listen"].Expr.Range().Ptr()
	}
	return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Invalid engine listen", Detail: detail, Subject: subject}}
}

var envNameRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// checkOperatorConfig validates operator_token_env.
func checkOperatorConfig(block *hcl.Block, e *EngineBlock) hcl.Diagnostics {
	if e.OperatorTokenEnv == "" {
		return nil
	}
	attrs, _ := block.Body.JustAttributes()
	subject := block.DefRange.Ptr()
	if a, ok := attrs["operator_token_env"]; ok {
		subject = a.Expr.Range().Ptr()
	}
	switch {
	case !envNameRe.MatchString(e.OperatorTokenEnv):
		return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Invalid operator_token_env",
			Detail: fmt.Sprintf("%q is not an environment variable name. Name the variable that holds the operator's token, such as \"FLUKSIO_OPERATOR_TOKEN\"; the token itself never goes in this file.",
				e.OperatorTokenEnv),
			Subject: subject}}
	case e.OperatorTokenEnv == e.SecretEnv:
		return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "operator_token_env is secret_env",
			Detail:  fmt.Sprintf("Both name %s. The operator's token opens the status page; the signing secret mints worker credentials. Use two variables.", e.SecretEnv),
			Subject: subject}}
	}
	return nil
}

// checkEngineURL warns when a provisioner's engine_url, the address its
// workers dial, names this machine on another port than engine.listen:
// the two are set in two places, and a worker that dials the wrong one
// never attaches (its job ends "died before attach" after minutes). Only
// a literal engine_url of loopback or the listen host is compared: one
// naming another host may be a proxy, a relay's or a load balancer's,
// which the engine cannot see through. The attribute is the plugins'
// convention (the Slurm and the Python plugin both take it), read here
// without decoding the rest of the block, which is the plugin's.
func checkEngineURL(p *host.Block, listen string) hcl.Diagnostics {
	if strings.HasPrefix(listen, "unix:") || p.Body == nil {
		return nil
	}
	content, _, _ := p.Body.PartialContent(&hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: "engine_url"}}})
	attr := content.Attributes["engine_url"]
	if attr == nil {
		return nil
	}
	v, d := attr.Expr.Value(nil)
	if d.HasErrors() || !v.IsKnown() || v.IsNull() || v.Type() != cty.String {
		return nil
	}
	u, err := url.Parse(v.AsString())
	if err != nil || u.Host == "" {
		return nil
	}
	lhost, lport, err := net.SplitHostPort(listen)
	if err != nil {
		return nil
	}
	uport := u.Port()
	if uport == "" {
		uport = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	local := u.Hostname() == "localhost" || u.Hostname() == lhost
	if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsLoopback() {
		local = true
	}
	if !local || uport == lport || lport == "0" {
		return nil
	}
	return hcl.Diagnostics{{
		Severity: hcl.DiagWarning, Summary: "engine_url does not reach the engine",
		Detail: fmt.Sprintf("Provisioner %q's workers dial %s, but the engine listens on %s (engine.listen): port %s, not %s. Make them agree, or its workers never attach.",
			p.Name, v.AsString(), listen, lport, uport),
		Subject: attr.Expr.Range().Ptr(),
	}}
}
