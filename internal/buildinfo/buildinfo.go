// Package buildinfo says which build of the module a binary is, from what
// the Go toolchain stamped into it: the module's version and the VCS
// revision it was built from. Both binaries (the engine and the plugin)
// answer --version with it, so an operator can tell an old plugin from a
// new engine without a release process of ours.
//
// Design records: docs/design/buildinfo-version.md.
package buildinfo

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// Info is what the toolchain recorded about a build.
type Info struct {
	// Module is the main module's path and Version its version: a tag,
	// a pseudo-version, or "(devel)" when the toolchain could not tell.
	Module, Version string
	// Revision is the VCS commit, empty when the build had no VCS
	// information (go build -buildvcs=false, or outside a checkout);
	// Modified says the work tree had uncommitted changes.
	Revision string
	Modified bool
	// Go is the toolchain that built the binary.
	Go string
}

// Read returns the running binary's build information.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "(unknown)"}
	}
	info := Info{Module: bi.Main.Path, Version: bi.Main.Version, Go: bi.GoVersion}
	if info.Version == "" {
		info.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// Line is the one line --version prints for a program:
//
//	host-example (devel) github.com/fluksio/provision rev 1a2b3c4d5e6f go1.26.8
//
// extra, when given, goes after the version (a plugin's kind and contract).
func (i Info) Line(program string, extra ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", program, i.Version)
	for _, e := range extra {
		b.WriteString(" " + e)
	}
	if i.Module != "" {
		b.WriteString(" " + i.Module)
	}
	if i.Revision != "" {
		rev := i.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		b.WriteString(" rev " + rev)
		if i.Modified {
			b.WriteString("+modified")
		}
	} else {
		b.WriteString(" rev unknown")
	}
	if i.Go != "" {
		b.WriteString(" " + i.Go)
	}
	return b.String()
}
