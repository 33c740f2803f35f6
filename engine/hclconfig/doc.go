// Package hclconfig is the host's side of configuration: it decodes the
// part of an HCL (or HCL-JSON) block that belongs to a plugin against the
// schema the plugin declared, into the JSON the plugin receives, and maps
// the plugin's diagnostics, which name paths such as
// ["profile", "1", "sbatch", "0"], back to file:line:col.
//
// Why a package of its own: a plugin never parses HCL. It declares a
// schema and receives JSON, so the contract (package shared) and the
// plugin SDK must not link an HCL parser; when this code lived in shared,
// the Slurm plugin binary linked 17 hcl and cty packages it never used.
// `make check-plugin-deps` keeps it so.
//
// It owns: decoding against a shared.Schema, the diagnostics for what
// does not fit (with a detail that says how to fix it), the mapping of
// plugin diagnostics to source ranges, and the bounds on what a parser is
// given at all (CheckConfigSource: size, nesting and expression chains,
// checked before parsing, because the parsers recurse and a deep file
// overflows the stack), and the text rendering of diagnostics (bounded:
// 50 printed, each costing its own lines). It may not touch plugins, processes or the network: it is pure
// functions over parsed bodies, so a validate command can use it with no
// side effect.
package hclconfig
