package shared

import (
	"fmt"
	"regexp"
	"strings"
)

// Schema describes a provisioner's configuration: the attributes and
// nested blocks allowed in the body of its provisioner block. The host
// decodes HCL against it and hands the plugin plain JSON, so a plugin
// never needs an HCL parser.
type Schema struct {
	Attributes []Attribute
	Blocks     []BlockType
}

// Type is the type of an attribute's value.
type Type string

const (
	TypeString     Type = "string"
	TypeBool       Type = "bool"
	TypeInt        Type = "int"
	TypeNumber     Type = "number"
	TypeListString Type = "list(string)"
	// TypeStringOrList is a string or a list of strings, for a setting
	// that usually has one value and may have several (the Slurm
	// plugin's login). The host passes on what was written: a JSON
	// string or a JSON array of strings; a list's elements are checked
	// one by one, each at its own position.
	TypeStringOrList Type = "string|list(string)"
	// TypeDuration is a string in Go's duration syntax ("90s", "5m",
	// "1h30m"). The host checks it, so a bad one is reported at its
	// position, and it must be positive.
	TypeDuration Type = "duration"
)

// Attribute is one name = value in a body.
type Attribute struct {
	Name        string
	Type        Type
	Required    bool
	Description string
	// Default is the value used when the attribute is absent: a Go value
	// that encodes to JSON of the attribute's type. Nil means null.
	Default any
	// Sensitive values are never echoed in diagnostics or logs.
	Sensitive bool
}

// BlockType is a kind of nested block, such as profile "gpu" { ... }.
type BlockType struct {
	// Name is the block's type name, "profile".
	Name string
	// Labels names the block's labels in order; each becomes a string
	// field of the block's JSON object.
	Labels      []string
	Description string
	Body        *Schema
	// MinItems and MaxItems bound how many blocks of this type may appear;
	// 0 for MaxItems means no bound.
	MinItems int
	MaxItems int
}

// Validate checks that a schema is one the host can decode against:
// known types, no duplicate names, no clash with the host's own
// meta-arguments. Hosts call it before trusting a plugin's schema.
func (s *Schema) Validate(reserved ...string) error {
	if s == nil {
		return nil
	}
	seen := map[string]bool{}
	for _, r := range reserved {
		seen[r] = true
	}
	return s.validate("", seen)
}

func (s *Schema) validate(at string, seen map[string]bool) error {
	claim := func(name string) error {
		if name == "" {
			return fmt.Errorf("schema%s: an attribute or block has no name", at)
		}
		if seen[name] {
			return fmt.Errorf("schema%s: %q is declared twice or is reserved by the host", at, name)
		}
		seen[name] = true
		return nil
	}
	for _, a := range s.Attributes {
		if err := claim(a.Name); err != nil {
			return err
		}
		switch a.Type {
		case TypeString, TypeBool, TypeInt, TypeNumber, TypeListString, TypeStringOrList, TypeDuration:
		default:
			return fmt.Errorf("schema%s: attribute %q has unknown type %q", at, a.Name, a.Type)
		}
	}
	for _, b := range s.Blocks {
		if err := claim(b.Name); err != nil {
			return err
		}
		inner := map[string]bool{}
		for _, l := range b.Labels {
			inner[l] = true
		}
		body := b.Body
		if body == nil {
			body = &Schema{}
		}
		if err := body.validate(at+"."+b.Name, inner); err != nil {
			return err
		}
	}
	return nil
}

// Severity says whether a diagnostic stops the configuration being used.
type Severity int

const (
	SeverityError Severity = iota + 1
	SeverityWarning
)

// Diagnostic is one problem with a configuration, in words a person who
// wrote the config can act on.
type Diagnostic struct {
	Severity Severity
	// Summary is short: "Invalid profile name".
	Summary string
	// Detail says what is wrong and how to fix it.
	Detail string
	// Path addresses the offending value in the JSON configuration: object
	// keys and list indexes, such as ["profile", "1", "sbatch", "0"]. The
	// host maps it back to a file, line and column. Empty means the block
	// as a whole.
	Path []string
}

// Diagnostics is a list of problems.
type Diagnostics []Diagnostic

// HasErrors reports whether any diagnostic is an error.
func (d Diagnostics) HasErrors() bool {
	for _, x := range d {
		if x.Severity == SeverityError {
			return true
		}
	}
	return false
}

// Error renders the diagnostics on one line each, for logs and tests.
func (d Diagnostics) Error() string {
	var b strings.Builder
	for i, x := range d {
		if i > 0 {
			b.WriteString("\n")
		}
		if len(x.Path) > 0 {
			b.WriteString(strings.Join(x.Path, "."))
			b.WriteString(": ")
		}
		b.WriteString(x.Summary)
		if x.Detail != "" {
			b.WriteString(": ")
			b.WriteString(x.Detail)
		}
	}
	return b.String()
}

// Errorf returns an error diagnostic at path.
func Errorf(path []string, summary, detailFormat string, args ...any) Diagnostic {
	return Diagnostic{Severity: SeverityError, Summary: summary, Detail: fmt.Sprintf(detailFormat, args...), Path: path}
}

// nameRe is the alphabet of ValidName.
var nameRe = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// ValidName reports whether s is made only of letters, digits, '.', '_'
// and '-'. Every name that reaches a job script, an ssh command line, a
// file name or a log line (provisioners, profiles, labels, workers) keeps
// to it, so that none of them ever needs quoting or can mean anything to
// a shell, to squeue's comma lists or to #SBATCH parsing.
func ValidName(s string) bool { return nameRe.MatchString(s) }
