// Package hclconfig is the host's side of configuration: it decodes the
// part of an HCL (or HCL-JSON) block that belongs to a plugin against the
// schema the plugin declared, into the JSON the plugin receives
// (DecodeConfig), maps the plugin's diagnostics, which name paths such as
// ["profile", "1", "sbatch", "0"], back to file:line:col
// (ConfigDiagnostics), bounds what a parser is given (CheckConfigSource)
// and renders diagnostics (WriteDiagnostics). It is pure functions over
// parsed bodies: no plugins, processes or network. The contract and the
// plugin SDK never link it (`make check-plugin-deps`).
//
// Design records: docs/design/hclconfig-package.md,
// docs/design/hclconfig-limits.md.
package hclconfig
