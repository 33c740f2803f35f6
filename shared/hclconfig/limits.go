package hclconfig

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// A configuration file is input too, and the parsers are recursive: a
// 200 KB file of nested brackets crashed `validate` with a fatal stack
// overflow (which no recover catches), and a 35 MB list took 65 s and
// 8.3 GB. CheckConfigSource bounds both before a parser sees the file:
// its size, and how deeply brackets, braces, parentheses and template
// interpolations nest. The depth is counted on the lexer's tokens (HCL's
// lexer is a state machine, not recursive) or, for JSON, by a scan that
// skips strings, so a bracket inside a string counts for nothing.
//
// The limits are far above any real configuration: a provisioner block
// nests three or four deep.
const (
	// MaxConfigBytes is the largest configuration file read.
	MaxConfigBytes = 1 << 20
	// MaxConfigDepth is the deepest nesting accepted.
	MaxConfigDepth = 64
)

// CheckConfigSource returns an error diagnostic, at the place it found
// it, if src is too large or nests too deeply to parse safely; json says
// the file is HCL's JSON syntax.
func CheckConfigSource(src []byte, filename string, json bool) hcl.Diagnostics {
	if len(src) > MaxConfigBytes {
		return hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Configuration file too large",
			Detail: fmt.Sprintf("%s is %d bytes; a configuration may be at most %d (1 MiB). A real one is a few kilobytes: check that this is the file you meant.",
				filename, len(src), MaxConfigBytes),
			Subject: &hcl.Range{Filename: filename, Start: hcl.InitialPos, End: hcl.InitialPos},
		}}
	}
	var at *hcl.Range
	if json {
		at = jsonTooDeep(src, filename)
	} else {
		at = hclTooDeep(src, filename)
	}
	if at == nil {
		return nil
	}
	return hcl.Diagnostics{{
		Severity: hcl.DiagError,
		Summary:  "Configuration nested too deeply",
		Detail:   fmt.Sprintf("Brackets, braces and parentheses nest more than %d deep here. A configuration nests a few levels; look for an unclosed bracket.", MaxConfigDepth),
		Subject:  at,
	}}
}

func hclTooDeep(src []byte, filename string) *hcl.Range {
	tokens, _ := hclsyntax.LexConfig(src, filename, hcl.InitialPos)
	depth := 0
	for _, tok := range tokens {
		switch tok.Type {
		case hclsyntax.TokenOBrace, hclsyntax.TokenOBrack, hclsyntax.TokenOParen,
			hclsyntax.TokenTemplateInterp, hclsyntax.TokenTemplateControl:
			depth++
			if depth > MaxConfigDepth {
				r := tok.Range
				return &r
			}
		case hclsyntax.TokenCBrace, hclsyntax.TokenCBrack, hclsyntax.TokenCParen, hclsyntax.TokenTemplateSeqEnd:
			if depth > 0 {
				depth--
			}
		}
	}
	return nil
}

func jsonTooDeep(src []byte, filename string) *hcl.Range {
	depth, line, col := 0, 1, 1
	inString, escaped := false, false
	for i, c := range src {
		if c == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			if depth > MaxConfigDepth {
				pos := hcl.Pos{Line: line, Column: col - 1, Byte: i}
				return &hcl.Range{Filename: filename, Start: pos, End: hcl.Pos{Line: line, Column: col, Byte: i + 1}}
			}
		case c == ']' || c == '}':
			if depth > 0 {
				depth--
			}
		}
	}
	return nil
}

// ParseFile reads the configuration file at path with parser, bounded as
// CheckConfigSource says, and parses it as HCL, or as HCL's JSON syntax
// when the name ends in .json. At most one byte more than MaxConfigBytes
// is read, so a huge file is refused without being read. The parser keeps
// the source, so that WriteDiagnostics can show the lines at fault.
func ParseFile(parser *hclparse.Parser, path string) (*hcl.File, hcl.Diagnostics) {
	src, err := readBounded(path)
	if err != nil {
		return nil, hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Configuration file not found",
			Detail:   fmt.Sprintf("Could not read %s: %v. Check the path.", path, errors.Unwrap(err)),
		}}
	}
	isJSON := strings.HasSuffix(path, ".json")
	if diags := CheckConfigSource(src, path, isJSON); diags.HasErrors() {
		return nil, diags
	}
	if isJSON {
		return parser.ParseJSON(src, path)
	}
	return parser.ParseHCL(src, path)
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, MaxConfigBytes+1))
}
