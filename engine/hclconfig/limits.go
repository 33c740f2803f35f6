package hclconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// A configuration file is input too, and HCL's parsers and evaluator are
// recursive: a file nested deeply enough, or one expression chained long
// enough, overflows the stack, which is fatal in Go (no recover catches
// it). CheckConfigSource bounds the file before a parser sees it: its
// size, how deeply brackets, braces, parentheses and template
// interpolations nest, and how long a chain one expression makes at one
// nesting level (operators, splats, indexes and attribute steps). Both are
// counted on the lexer's tokens (HCL's lexer is not recursive) or, for
// JSON, by a scan that skips strings. The limits are far above any real
// configuration.
const (
	// MaxConfigBytes is the largest configuration file read.
	MaxConfigBytes = 1 << 20
	// MaxConfigDepth is the deepest nesting accepted.
	MaxConfigDepth = 64
	// MaxConfigChain is the longest chain of operators, splats, indexes
	// and attribute steps accepted in one expression at one nesting
	// level. With MaxConfigDepth it bounds the parser's and evaluator's
	// recursion at 64 × 256 frames.
	MaxConfigChain = 256
)

// CheckConfigSource returns an error diagnostic, at the place it found
// it, if src is too large, nests too deeply or chains too long to parse
// safely; json says the file is HCL's JSON syntax.
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
	var p *tooDeep
	if json {
		p = jsonTooDeep(src, filename)
	} else {
		tokens, _ := hclsyntax.LexConfig(src, filename, hcl.InitialPos)
		p = tokensTooDeep(tokens)
	}
	if p == nil {
		return nil
	}
	if p.chain {
		return hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Expression chained too long",
			Detail: fmt.Sprintf("One expression here chains more than %d operators, splats, indexes or attribute steps (such as a run of `!`, `-` or `[*]`). A configuration's expression is a value or a reference a few steps long: shorten this one, or look for a character repeated by mistake.",
				MaxConfigChain),
			Subject: &p.at,
		}}
	}
	return hcl.Diagnostics{{
		Severity: hcl.DiagError,
		Summary:  "Configuration nested too deeply",
		Detail:   fmt.Sprintf("Brackets, braces and parentheses nest more than %d deep here. A configuration nests a few levels; look for an unclosed bracket.", MaxConfigDepth),
		Subject:  &p.at,
	}}
}

// tooDeep is where a source went past a limit, and which.
type tooDeep struct {
	at    hcl.Range
	chain bool // MaxConfigChain, else MaxConfigDepth
}

// level is one open bracket of tokensTooDeep: its kind, and how long a
// chain the expression being read at this level has made so far.
type level struct {
	// newlineEnds says the parser ends an expression at a newline here:
	// at the top, in a block's body and in an object constructor, but not
	// inside (), [], ${} or a {for ...}, where newlines are ignored (so
	// lines of one `!` each are still one chain).
	newlineEnds bool
	chain       int
}

// chainTokens are the tokens that add one step to an expression's
// recursion: each unary or binary operator, the `?` of a conditional, an
// attribute step, an index or splat's `[`, and a splat's `*`.
var chainTokens = map[hclsyntax.TokenType]bool{
	hclsyntax.TokenBang: true, hclsyntax.TokenMinus: true, hclsyntax.TokenPlus: true,
	hclsyntax.TokenStar: true, hclsyntax.TokenSlash: true, hclsyntax.TokenPercent: true,
	hclsyntax.TokenAnd: true, hclsyntax.TokenOr: true,
	hclsyntax.TokenEqualOp: true, hclsyntax.TokenNotEqual: true,
	hclsyntax.TokenLessThan: true, hclsyntax.TokenLessThanEq: true,
	hclsyntax.TokenGreaterThan: true, hclsyntax.TokenGreaterThanEq: true,
	hclsyntax.TokenQuestion: true, hclsyntax.TokenDot: true, hclsyntax.TokenOBrack: true,
	hclsyntax.TokenEllipsis: true,
}

func tokensTooDeep(tokens hclsyntax.Tokens) *tooDeep {
	stack := []level{{newlineEnds: true}}
	for i, tok := range tokens {
		top := &stack[len(stack)-1]
		if chainTokens[tok.Type] {
			top.chain++
			if top.chain > MaxConfigChain {
				return &tooDeep{at: tok.Range, chain: true}
			}
		}
		switch tok.Type {
		case hclsyntax.TokenComma, hclsyntax.TokenEqual, hclsyntax.TokenFatArrow:
			top.chain = 0
		case hclsyntax.TokenNewline:
			if top.newlineEnds {
				top.chain = 0
			}
		case hclsyntax.TokenOBrace, hclsyntax.TokenOBrack, hclsyntax.TokenOParen,
			hclsyntax.TokenTemplateInterp, hclsyntax.TokenTemplateControl:
			if len(stack) > MaxConfigDepth {
				return &tooDeep{at: tok.Range}
			}
			stack = append(stack, level{newlineEnds: tok.Type == hclsyntax.TokenOBrace && !forNext(tokens[i+1:])})
		case hclsyntax.TokenCBrace, hclsyntax.TokenCBrack, hclsyntax.TokenCParen, hclsyntax.TokenTemplateSeqEnd:
			if len(stack) > 1 {
				stack = stack[:len(stack)-1]
			}
		}
	}
	return nil
}

// forNext says the next token after newlines is the keyword `for`: a
// brace that opens a for expression, not an object or a body.
func forNext(rest hclsyntax.Tokens) bool {
	for _, t := range rest {
		if t.Type != hclsyntax.TokenNewline {
			return t.Type == hclsyntax.TokenIdent && string(t.Bytes) == "for"
		}
	}
	return false
}

func jsonTooDeep(src []byte, filename string) *tooDeep {
	depth, line, col := 0, 1, 1
	inString, escaped := false, false
	// strStart is where the string being read began, and templ says it
	// holds a `${` or `%{`.
	var strStart hcl.Pos
	templ := false
	for i, c := range src {
		pos := hcl.Pos{Line: line, Column: col, Byte: i}
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
			case c == '{' && i > 0 && (src[i-1] == '$' || src[i-1] == '%'):
				templ = true
			case c == '"':
				inString = false
				if templ {
					if p := jsonTemplateTooDeep(src[strStart.Byte:i+1], filename, strStart); p != nil {
						return p
					}
				}
			}
		case c == '"':
			inString, templ, strStart = true, false, pos
		case c == '[' || c == '{':
			depth++
			if depth > MaxConfigDepth {
				return &tooDeep{at: hcl.Range{Filename: filename, Start: pos, End: hcl.Pos{Line: line, Column: col, Byte: i + 1}}}
			}
		case c == ']' || c == '}':
			if depth > 0 {
				depth--
			}
		}
	}
	return nil
}

// jsonTemplateTooDeep checks one JSON string, quotes included, as the
// HCL template it becomes when decoded. A string that is not valid JSON
// is left to the parser, which says so.
func jsonTemplateTooDeep(quoted []byte, filename string, at hcl.Pos) *tooDeep {
	var s string
	if err := json.Unmarshal(quoted, &s); err != nil {
		return nil
	}
	tokens, _ := hclsyntax.LexTemplate([]byte(s), filename, at)
	p := tokensTooDeep(tokens)
	if p != nil {
		// Escapes make the template's positions drift from the file's:
		// point at the string itself.
		p.at = hcl.Range{Filename: filename, Start: at, End: hcl.Pos{Line: at.Line, Column: at.Column + 1, Byte: at.Byte + 1}}
	}
	return p
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
