package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
)

// The command line is Go's flag package, used the way operators expect of
// the tools they know (terraform, nomad, go itself): single-dash long
// flags, -h on every command exiting 0 with its usage on stdout, and
// flags allowed after the positional arguments ("validate cfg.hcl -json").

// parseArgs parses args into fs, taking flags wherever they stand among the
// positional arguments, which it returns in order. A "--" ends the flags:
// everything after it is positional. On -h (or -help, --help) it writes
// the command's usage to stdout and says to exit 0; on a bad flag it
// writes the error and the usage to stderr and says to exit 2. done
// reports whether the caller should exit with code.
func parseArgs(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (positional []string, code int, done bool) {
	// The flag package writes its usage before it returns; buffer it, so
	// that help goes to stdout and a mistake to stderr.
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	defer fs.SetOutput(stderr)
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			stdout.Write(buf.Bytes())
			return nil, 0, true
		}
		if err != nil {
			stderr.Write(buf.Bytes())
			return nil, 2, true
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, 0, false
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(positional, rest...), 0, false
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// usageError writes a usage mistake the flag package cannot see (a missing
// argument, one too many) and the command's usage to stderr, and returns
// the exit code for it.
func usageError(fs *flag.FlagSet, stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "%s: "+format+"\n", append([]any{fs.Name()}, args...)...)
	fs.SetOutput(stderr)
	fs.Usage()
	return 2
}
