package hclconfig

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/mitchellh/go-wordwrap"

	"github.com/fluksio/provision/internal/termsafe"
)

// One renderer for every command that reports on a configuration, so an
// operator reads the same shape from validate and from a failed start,
// and a script reads the same JSON.

// MaxPrintedDiagnostics is how many problems WriteDiagnostics prints in
// full; the rest are counted in one line. A file of thousands of bad
// blocks is not read by a person past the first screens, and -json prints
// them all.
const MaxPrintedDiagnostics = 50

// WriteDiagnostics prints each problem as FILE:LINE:COL: summary, then
// the shape of hcl's own rendering: the source lines at fault, the block
// they are in, and the detail. At most MaxPrintedDiagnostics are printed,
// then "and N more".
//
// Not hcl.NewDiagnosticTextWriter: it scans the whole file from its first
// byte for every diagnostic (columns by grapheme cluster), so printing
// grows with diagnostics times file size. Here each file's line starts
// are found once and a diagnostic costs only its own lines.
func WriteDiagnostics(w io.Writer, files map[string]*hcl.File, diags hcl.Diagnostics) {
	// Every byte goes through termsafe: a name or value from the file or
	// a plugin, the file's own lines and its name are shown escaped, not
	// acted on by the terminal; the first line's are kept on it.
	bw := bufio.NewWriter(termsafe.Writer(w))
	defer bw.Flush()
	lines := map[string][]int{}
	for i, d := range diags {
		if i == MaxPrintedDiagnostics {
			fmt.Fprintf(bw, "and %d more (validate -json lists them all)\n", len(diags)-i)
			return
		}
		sev, title := "error", "Error"
		if d.Severity == hcl.DiagWarning {
			sev, title = "warning", "Warning"
		}
		summary := termsafe.EscapeLine(d.Summary)
		if d.Subject != nil {
			fmt.Fprintf(bw, "%s:%d:%d: %s: %s\n", termsafe.EscapeLine(d.Subject.Filename), d.Subject.Start.Line, d.Subject.Start.Column, sev, summary)
		} else {
			fmt.Fprintf(bw, "%s: %s\n", sev, summary)
		}
		fmt.Fprintf(bw, "%s: %s\n\n", title, summary)
		if d.Subject != nil {
			writeSnippet(bw, files[d.Subject.Filename], lines, d)
		}
		if d.Detail != "" {
			fmt.Fprintf(bw, "%s\n\n", wordwrap.WrapString(d.Detail, 100))
		}
	}
}

// writeSnippet prints where d is and the source lines its subject (and
// context) cover, at most maxSnippetLines of them; lines caches each
// file's line starts.
func writeSnippet(w io.Writer, file *hcl.File, lines map[string][]int, d *hcl.Diagnostic) {
	name := d.Subject.Filename
	if file == nil || file.Bytes == nil {
		fmt.Fprintf(w, "  on %s line %d:\n  (source code not available)\n\n", termsafe.EscapeLine(name), d.Subject.Start.Line)
		return
	}
	in := ""
	if nav, ok := file.Nav.(interface{ ContextString(int) string }); ok {
		if c := nav.ContextString(d.Subject.Start.Byte); c != "" {
			in = ", in " + c
		}
	}
	fmt.Fprintf(w, "  on %s line %d%s:\n", termsafe.EscapeLine(name), d.Subject.Start.Line, in)
	src := file.Bytes
	starts, ok := lines[name]
	if !ok {
		starts = lineStarts(src)
		lines[name] = starts
	}
	r := *d.Subject
	if d.Context != nil {
		r = hcl.RangeOver(r, *d.Context)
	}
	// The line holding a byte is the last line starting at or before it.
	lineOf := func(b int) int { return sort.SearchInts(starts, b+1) - 1 }
	first, last := lineOf(max(r.Start.Byte, 0)), lineOf(max(r.End.Byte-1, r.Start.Byte, 0))
	last = min(last, first+maxSnippetLines-1, len(starts)-1)
	for l := max(first, 0); l <= last; l++ {
		end := len(src)
		if l+1 < len(starts) {
			end = starts[l+1]
		}
		text := strings.TrimRight(string(src[starts[l]:end]), "\r\n")
		fmt.Fprintf(w, "%4d: %s\n", l+1, text)
	}
	fmt.Fprintln(w)
}

// maxSnippetLines bounds the source printed for one diagnostic, so a
// subject that spans a whole file prints a screen, not the file.
const maxSnippetLines = 10

// lineStarts is the byte offset at which each line of src begins.
func lineStarts(src []byte) []int {
	starts := []int{0}
	for i, c := range src {
		if c == '\n' && i+1 < len(src) {
			starts = append(starts, i+1)
		}
	}
	return starts
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

// WriteDiagnosticsJSON prints diags as one JSON object: valid, and each
// diagnostic with its severity, summary, detail and range.
func WriteDiagnosticsJSON(w io.Writer, diags hcl.Diagnostics) error {
	return WritePreflightJSON(w, diags, nil)
}

// WritePreflightJSON is WriteDiagnosticsJSON with a preflight's findings
// (validate -check) as one more member, "preflight", when not nil.
func WritePreflightJSON(w io.Writer, diags hcl.Diagnostics, preflight any) error {
	out := struct {
		Valid       bool             `json:"valid"`
		Diagnostics []jsonDiagnostic `json:"diagnostics"`
		Preflight   any              `json:"preflight,omitempty"`
	}{Valid: !diags.HasErrors(), Diagnostics: []jsonDiagnostic{}, Preflight: preflight}
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
	// encoding/json leaves U+202E, C1 and DEL as they are; termsafe
	// writes them as JSON escapes, which decode to the same text.
	enc := json.NewEncoder(termsafe.Writer(w))
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
