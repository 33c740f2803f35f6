package hclconfig

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"

	"github.com/fluksio/provision/shared"
)

// DecodeConfig decodes the plugin-owned part of a provisioner block
// against the plugin's schema into a JSON object, so that a plugin in any
// language never needs an HCL parser.
// The object has every attribute of the schema by name (its default when
// absent, null when absent without a default) and every block type as a
// list of objects in source order, never null. Each block object holds
// its labels as string fields named by shared.BlockType.Labels, next to
// the block body's own attributes and blocks. Every problem is reported
// with a source range and a detail that says how to fix it; the JSON is
// nil when any diagnostic is an error.
//
// body may be the "remain" body gohcl leaves after the host took its
// meta-arguments: those are hidden from Content and so are neither
// reported as unknown nor copied into the JSON.
func DecodeConfig(body hcl.Body, schema *shared.Schema, ctx *hcl.EvalContext) (json.RawMessage, hcl.Diagnostics) {
	if schema == nil {
		schema = &shared.Schema{}
	}
	obj, diags := decodeBody(body, schema, ctx)
	SortDiagnostics(diags)
	if diags.HasErrors() {
		return nil, diags
	}
	out, err := json.Marshal(obj)
	if err != nil {
		// Only a default value in the plugin's schema can get here, so
		// the fault is the plugin's, not the user's.
		diags = append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Invalid plugin schema",
			Detail:   fmt.Sprintf("The plugin's schema has a default value that cannot be encoded as JSON (%v). Report this to the plugin's author.", err),
			Subject:  body.MissingItemRange().Ptr(),
		})
		return nil, diags
	}
	return out, diags
}

// decodeBody walks one body by hand rather than through hcldec: hcldec
// returns one cty value for the whole body and forgets which block each
// element came from, but the int and duration checks need the range of
// the attribute inside the Nth block. Body.Content is the same call
// hcldec makes, so unknown names get the same diagnostics.
func decodeBody(body hcl.Body, s *shared.Schema, ctx *hcl.EvalContext) (map[string]any, hcl.Diagnostics) {
	content, diags := body.Content(bodySchema(s))
	if content == nil {
		content = &hcl.BodyContent{MissingItemRange: body.MissingItemRange()}
	}
	diags = explainUnsupported(diags, s)

	out := make(map[string]any, len(s.Attributes)+len(s.Blocks))
	for _, a := range s.Attributes {
		attr := content.Attributes[a.Name]
		if attr == nil {
			if a.Required {
				diags = append(diags, missingAttribute(a, content.MissingItemRange))
			}
			out[a.Name] = a.Default
			continue
		}
		v, d := decodeAttribute(attr, a, ctx)
		diags = append(diags, d...)
		out[a.Name] = v
	}

	for _, bt := range s.Blocks {
		var blocks []*hcl.Block
		for _, b := range content.Blocks {
			if b.Type == bt.Name {
				blocks = append(blocks, b)
			}
		}
		diags = append(diags, checkBlockCount(bt, blocks, content.MissingItemRange)...)

		// An empty list rather than null, so a plugin can range over it
		// without a nil check.
		list := make([]any, 0, len(blocks))
		for _, b := range blocks {
			obj, d := decodeBody(b.Body, blockBody(bt), ctx)
			diags = append(diags, d...)
			for i, l := range bt.Labels {
				if i < len(b.Labels) {
					obj[l] = b.Labels[i]
				}
			}
			list = append(list, obj)
		}
		out[bt.Name] = list
	}
	return out, diags
}

// bodySchema is the HCL view of a schema. Nothing is marked required:
// missing attributes are reported by decodeBody, whose detail says what
// to add, and the path walk in ConfigDiagnostics must not fail on them.
func bodySchema(s *shared.Schema) *hcl.BodySchema {
	hs := &hcl.BodySchema{}
	for _, a := range s.Attributes {
		hs.Attributes = append(hs.Attributes, hcl.AttributeSchema{Name: a.Name})
	}
	for _, b := range s.Blocks {
		hs.Blocks = append(hs.Blocks, hcl.BlockHeaderSchema{Type: b.Name, LabelNames: b.Labels})
	}
	return hs
}

func blockBody(bt shared.BlockType) *shared.Schema {
	if bt.Body == nil {
		return &shared.Schema{}
	}
	return bt.Body
}

// explainUnsupported adds the allowed names to HCL's "not expected here"
// diagnostics when HCL found no close match to suggest, so the reader
// learns what to write instead of only what not to write.
func explainUnsupported(diags hcl.Diagnostics, s *shared.Schema) hcl.Diagnostics {
	for i, d := range diags {
		if strings.Contains(d.Detail, "Did you mean") {
			continue
		}
		var names []string
		switch d.Summary {
		case "Unsupported argument":
			for _, a := range s.Attributes {
				names = append(names, a.Name)
			}
		case "Unsupported block type":
			for _, b := range s.Blocks {
				names = append(names, b.Name)
			}
		case "Extraneous JSON object property":
			for _, a := range s.Attributes {
				names = append(names, a.Name)
			}
			for _, b := range s.Blocks {
				names = append(names, b.Name)
			}
		default:
			continue
		}
		c := *d
		if len(names) == 0 {
			c.Detail += " Nothing of that kind is allowed here; remove it."
		} else {
			c.Detail += " Use one of: " + strings.Join(names, ", ") + "."
		}
		diags[i] = &c
	}
	return diags
}

func missingAttribute(a shared.Attribute, at hcl.Range) *hcl.Diagnostic {
	return &hcl.Diagnostic{
		Severity: hcl.DiagError,
		Summary:  "Missing required argument",
		Detail: fmt.Sprintf("The argument %q is required, but no definition was found. Add a line such as %s = %s to this block.",
			a.Name, a.Name, example(a.Type)),
		Subject: at.Ptr(),
	}
}

func checkBlockCount(bt shared.BlockType, blocks []*hcl.Block, missing hcl.Range) hcl.Diagnostics {
	n := len(blocks)
	switch {
	case n < bt.MinItems:
		summary := fmt.Sprintf("Missing %s block", bt.Name)
		if n > 0 {
			summary = fmt.Sprintf("Not enough %s blocks", bt.Name)
		}
		return hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  summary,
			Detail: fmt.Sprintf("At least %d %q block(s) are required here, but %d were found. Add one such as %s.",
				bt.MinItems, bt.Name, n, blockExample(bt)),
			Subject: missing.Ptr(),
		}}
	case bt.MaxItems > 0 && n > bt.MaxItems:
		return hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  fmt.Sprintf("Too many %s blocks", bt.Name),
			Detail: fmt.Sprintf("At most %d %q block(s) are allowed here, but %d were found. Remove this one and any after it.",
				bt.MaxItems, bt.Name, n),
			Subject: blocks[bt.MaxItems].DefRange.Ptr(),
		}}
	}
	return nil
}

func blockExample(bt shared.BlockType) string {
	var b strings.Builder
	b.WriteString(bt.Name)
	for _, l := range bt.Labels {
		fmt.Fprintf(&b, " \"<%s>\"", l)
	}
	b.WriteString(" { ... }")
	return b.String()
}

// example is a value of the type, for details that say what to write.
func example(t shared.Type) string {
	switch t {
	case shared.TypeBool:
		return "true"
	case shared.TypeInt:
		return "22"
	case shared.TypeNumber:
		return "1.5"
	case shared.TypeListString:
		return `["a", "b"]`
	case shared.TypeStringOrList:
		return `"a" or ["a", "b"]`
	case shared.TypeDuration:
		return `"5m"`
	default:
		return `"..."`
	}
}

// expectation is the sentence that tells the reader what shape of value
// the attribute takes.
func expectation(t shared.Type) string {
	switch t {
	case shared.TypeBool:
		return "Use true or false."
	case shared.TypeInt:
		return "Use a whole number, such as 22."
	case shared.TypeNumber:
		return "Use a number, such as 1.5."
	case shared.TypeListString:
		return `Use a list of strings, such as ["a", "b"].`
	case shared.TypeStringOrList:
		return `Use a quoted string, such as "a", or a list of strings, such as ["a", "b"].`
	case shared.TypeDuration:
		return durationHint
	default:
		return `Use a quoted string, such as "example".`
	}
}

const durationHint = `Use a number with a unit, such as "30s", "5m" or "1h".`

// ctyType is the type a scalar attribute's value is converted to; lists
// are converted element by element in decodeStringList.
func ctyType(t shared.Type) cty.Type {
	switch t {
	case shared.TypeBool:
		return cty.Bool
	case shared.TypeInt, shared.TypeNumber:
		return cty.Number
	default:
		// Durations are strings in the JSON; their syntax is checked
		// after conversion.
		return cty.String
	}
}

// decodeAttribute evaluates one attribute and returns its JSON value.
func decodeAttribute(attr *hcl.Attribute, a shared.Attribute, ctx *hcl.EvalContext) (any, hcl.Diagnostics) {
	rng := attr.Expr.Range()
	// invalid builds an error diagnostic at a range. The expression and context are
	// attached only for non-sensitive attributes, because the text writer
	// prints the values of the variables an expression refers to.
	invalid := func(at hcl.Range, summary, detail string) hcl.Diagnostics {
		d := &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: at.Ptr()}
		if !a.Sensitive {
			d.Expression, d.EvalContext = attr.Expr, ctx
		}
		return hcl.Diagnostics{d}
	}

	v, diags := attr.Expr.Value(ctx)
	if a.Sensitive {
		diags = withhold(diags, a.Name)
	}
	if diags.HasErrors() {
		return nil, diags
	}
	// Marks (such as a host's own "sensitive" mark) mean nothing in JSON.
	v, _ = v.UnmarkDeep()
	if !v.IsWhollyKnown() {
		return nil, append(diags, invalid(rng, "Value not known",
			fmt.Sprintf("The value of %q depends on something that is not known while the configuration is read. Use a value that is known now.", a.Name))...)
	}
	if v.IsNull() {
		if a.Required {
			return nil, append(diags, invalid(rng, "Missing required argument",
				fmt.Sprintf("The argument %q is required and must not be null. %s", a.Name, expectation(a.Type)))...)
		}
		// null stands for "not set", as in Terraform, so the default
		// applies.
		return a.Default, diags
	}

	if a.Type == shared.TypeListString {
		return decodeStringList(attr, v, a, invalid, diags)
	}
	if a.Type == shared.TypeStringOrList {
		// A string stays a string; anything list-like is a list,
		// its elements checked where they are written.
		if ty := v.Type(); ty.IsTupleType() || ty.IsListType() || ty.IsSetType() {
			return decodeStringList(attr, v, a, invalid, diags)
		}
	}
	cv, err := convert.Convert(v, ctyType(a.Type))
	if err != nil {
		// cty's conversion messages name types, never values, so they
		// are safe to show even for a sensitive attribute.
		return nil, append(diags, invalid(rng, "Incorrect attribute value type",
			fmt.Sprintf("Inappropriate value for argument %q: %s. %s", a.Name, err.Error(), expectation(a.Type)))...)
	}

	switch a.Type {
	case shared.TypeBool:
		return cv.True(), diags
	case shared.TypeString, shared.TypeStringOrList:
		return cv.AsString(), diags
	case shared.TypeNumber:
		bf := cv.AsBigFloat()
		if bf.IsInf() {
			return nil, append(diags, invalid(rng, fmt.Sprintf("Invalid value for %q", a.Name),
				fmt.Sprintf("The value of %q must be a finite number. %s", a.Name, expectation(a.Type)))...)
		}
		return json.Number(bf.Text('g', -1)), diags
	case shared.TypeInt:
		return decodeInt(cv.AsBigFloat(), a, rng, invalid, diags)
	case shared.TypeDuration:
		return decodeDuration(cv.AsString(), a, rng, invalid, diags)
	}
	return nil, append(diags, invalid(rng, "Invalid plugin schema",
		fmt.Sprintf("The plugin's schema gives %q the unknown type %q. Report this to the plugin's author.", a.Name, a.Type))...)
}

// decodeStringList converts a list element by element, so that a bad
// element is reported at its own range rather than at the whole list.
func decodeStringList(attr *hcl.Attribute, v cty.Value, a shared.Attribute, invalid invalidFunc, diags hcl.Diagnostics) (any, hcl.Diagnostics) {
	ty := v.Type()
	if !ty.IsTupleType() && !ty.IsListType() && !ty.IsSetType() {
		return nil, append(diags, invalid(attr.Expr.Range(), "Incorrect attribute value type",
			fmt.Sprintf("Inappropriate value for argument %q: list of string required, but have %s. %s",
				a.Name, ty.FriendlyName(), expectation(a.Type)))...)
	}
	out := make([]string, 0, v.LengthInt())
	for i, e := range v.AsValueSlice() {
		at, ok := elementRange(attr.Expr, i)
		if !ok {
			at = attr.Expr.Range()
		}
		if e.IsNull() {
			return nil, append(diags, invalid(at, fmt.Sprintf("Invalid value for %q", a.Name),
				fmt.Sprintf("Element %d of %q is null; the elements must be strings. Remove it or give it a value.", i, a.Name))...)
		}
		s, err := convert.Convert(e, cty.String)
		if err != nil {
			return nil, append(diags, invalid(at, "Incorrect attribute value type",
				fmt.Sprintf("Inappropriate value for element %d of %q: %s. %s", i, a.Name, err.Error(), expectation(a.Type)))...)
		}
		out = append(out, s.AsString())
	}
	return out, diags
}

type invalidFunc func(at hcl.Range, summary, detail string) hcl.Diagnostics

// decodeInt returns the number as a json.Number so that it is written as
// 22 and not 22.0, and a Go plugin can decode it into an int.
func decodeInt(bf *big.Float, a shared.Attribute, rng hcl.Range, invalid invalidFunc, diags hcl.Diagnostics) (any, hcl.Diagnostics) {
	got := ""
	if !a.Sensitive {
		got = fmt.Sprintf(" (got %s)", bf.Text('g', -1))
	}
	if bf.IsInf() || !bf.IsInt() {
		return nil, append(diags, invalid(rng, fmt.Sprintf("Invalid value for %q", a.Name),
			fmt.Sprintf("The value of %q must be a whole number%s. %s", a.Name, got, expectation(a.Type)))...)
	}
	i, _ := bf.Int(nil)
	if !i.IsInt64() {
		return nil, append(diags, invalid(rng, fmt.Sprintf("Invalid value for %q", a.Name),
			fmt.Sprintf("The value of %q is too large%s; it must fit in a 64-bit integer.", a.Name, got))...)
	}
	return json.Number(i.String()), diags
}

// decodeDuration checks the syntax here, with the position at hand,
// because the plugin could only report it by path. The JSON keeps the
// string as written.
func decodeDuration(s string, a shared.Attribute, rng hcl.Range, invalid invalidFunc, diags hcl.Diagnostics) (any, hcl.Diagnostics) {
	shown := fmt.Sprintf("%q", s)
	if a.Sensitive {
		shown = "The value"
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return nil, append(diags, invalid(rng, fmt.Sprintf("Invalid duration for %q", a.Name),
			fmt.Sprintf("%s is not a duration. %s", shown, durationHint))...)
	}
	if d <= 0 {
		return nil, append(diags, invalid(rng, fmt.Sprintf("Invalid duration for %q", a.Name),
			fmt.Sprintf("The value of %q must be longer than zero. %s", a.Name, durationHint))...)
	}
	return s, diags
}

// withhold replaces the details of diagnostics raised while evaluating a
// sensitive attribute. They come from HCL and cty functions, some of
// which quote their arguments (tonumber("...") does), so they may hold
// the secret. The summary and position stay, which is enough to find the
// mistake.
func withhold(diags hcl.Diagnostics, name string) hcl.Diagnostics {
	for i, d := range diags {
		c := *d
		c.Detail = fmt.Sprintf("The details are withheld because %q is sensitive and they might show its value. Check the expression at this position.", name)
		c.Expression, c.EvalContext = nil, nil
		diags[i] = &c
	}
	return diags
}

// SortDiagnostics puts diagnostics in source order, those without a range
// (about a whole file) first. HCL reports unknown
// names while ranging over a map, so without this the order would change
// from run to run.
func SortDiagnostics(diags hcl.Diagnostics) {
	slices.SortStableFunc(diags, func(x, y *hcl.Diagnostic) int {
		switch {
		case x.Subject == nil && y.Subject == nil:
			return 0
		case x.Subject == nil:
			return -1
		case y.Subject == nil:
			return 1
		}
		return cmp.Or(
			strings.Compare(x.Subject.Filename, y.Subject.Filename),
			cmp.Compare(x.Subject.Start.Byte, y.Subject.Start.Byte),
		)
	})
}

// elementRange is the range of the i-th element of a list written out in
// the source. It works for native syntax tuples and, through
// hcl.ExprList, for JSON arrays; a list computed by a function or
// variable has no element ranges, so the caller falls back to the whole
// expression.
func elementRange(expr hcl.Expression, i int) (hcl.Range, bool) {
	if i < 0 {
		return hcl.Range{}, false
	}
	if tc, ok := expr.(*hclsyntax.TupleConsExpr); ok {
		if i < len(tc.Exprs) {
			return tc.Exprs[i].Range(), true
		}
		return hcl.Range{}, false
	}
	if elems, diags := hcl.ExprList(expr); !diags.HasErrors() && i < len(elems) {
		return elems[i].Range(), true
	}
	return hcl.Range{}, false
}

// ConfigDiagnostics turns the diagnostics a plugin returned about its
// JSON configuration into HCL diagnostics at the source ranges their
// paths address, by walking each path through the same body that
// DecodeConfig decoded:
//
//   - an attribute name goes to the attribute's value, and a following
//     list index to that element when the list is written out;
//   - a block type name and an index N go to the Nth block of that type
//     in source order (its header when the path ends there);
//   - a label name inside a block goes to that label.
//
// A path that is empty or leads nowhere (a defaulted attribute, a name
// the schema does not have) stops at the nearest enclosing range found,
// so every diagnostic has a position to show.
func ConfigDiagnostics(body hcl.Body, schema *shared.Schema, diags shared.Diagnostics) hcl.Diagnostics {
	if schema == nil {
		schema = &shared.Schema{}
	}
	out := make(hcl.Diagnostics, 0, len(diags))
	for _, d := range diags {
		// Anything not explicitly a warning is treated as an error, so a
		// plugin that forgets to set shared.Severity cannot slip a problem past
		// the host.
		sev := hcl.DiagError
		if d.Severity == shared.SeverityWarning {
			sev = hcl.DiagWarning
		}
		rng := pathRange(body, schema, d.Path)
		out = append(out, &hcl.Diagnostic{
			Severity: sev,
			Summary:  d.Summary,
			Detail:   d.Detail,
			Subject:  &rng,
		})
	}
	return out
}

// pathRange finds the range a JSON path addresses. It reads each body
// through PartialContent rather than the fields of *hclsyntax.Body: for
// a body gohcl left as "remain" that is the only way to honour the host's
// hidden meta-arguments, and it works for JSON-syntax files too. Names
// outside the plugin's schema are never looked up, so a path such as
// ["plugin"] cannot land on the host's own argument.
func pathRange(body hcl.Body, s *shared.Schema, path []string) hcl.Range {
	best := bodyRange(body)
	for len(path) > 0 {
		content, _, _ := body.PartialContent(bodySchema(s))
		if content == nil {
			return best
		}
		key := path[0]

		if a := findAttribute(s, key); a != nil {
			attr := content.Attributes[key]
			if attr == nil {
				// The attribute was absent and took its default; the
				// enclosing block is the place to add it.
				return best
			}
			rng := attr.Expr.Range()
			if len(path) > 1 {
				if i, err := strconv.Atoi(path[1]); err == nil {
					if r, ok := elementRange(attr.Expr, i); ok {
						rng = r
					}
				}
			}
			return rng
		}

		bt := findBlockType(s, key)
		if bt == nil || len(path) < 2 {
			return best
		}
		n, err := strconv.Atoi(path[1])
		if err != nil || n < 0 {
			return best
		}
		var block *hcl.Block
		for _, b := range content.Blocks {
			if b.Type != key {
				continue
			}
			if n == 0 {
				block = b
				break
			}
			n--
		}
		if block == nil {
			return best
		}
		best = block.DefRange
		path = path[2:]
		if len(path) == 0 {
			return best
		}
		if j := slices.Index(bt.Labels, path[0]); j >= 0 {
			if j < len(block.LabelRanges) {
				return block.LabelRanges[j]
			}
			return best
		}
		body, s = block.Body, blockBody(*bt)
	}
	return best
}

// bodyRange is the range of a whole body: all of it for native syntax,
// else the point where HCL would report a missing item, which every body
// type can give.
func bodyRange(body hcl.Body) hcl.Range {
	if sb, ok := body.(*hclsyntax.Body); ok && sb.SrcRange.Filename != "" {
		return sb.SrcRange
	}
	return body.MissingItemRange()
}

func findAttribute(s *shared.Schema, name string) *shared.Attribute {
	for i := range s.Attributes {
		if s.Attributes[i].Name == name {
			return &s.Attributes[i]
		}
	}
	return nil
}

func findBlockType(s *shared.Schema, name string) *shared.BlockType {
	for i := range s.Blocks {
		if s.Blocks[i].Name == name {
			return &s.Blocks[i]
		}
	}
	return nil
}
