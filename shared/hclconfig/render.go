package hclconfig

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/hashicorp/hcl/v2"
)

// One renderer for every command that reports on a configuration, so an
// operator reads the same shape from validate and from a failed start,
// and a script reads the same JSON.

// WriteDiagnostics prints each problem as FILE:LINE:COL: summary, then
// hcl's own rendering with the source snippet and the detail.
func WriteDiagnostics(w io.Writer, files map[string]*hcl.File, diags hcl.Diagnostics) {
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
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
