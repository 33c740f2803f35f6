package worker

import (
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/fluksio/provision/shared"
)

// removeJobLog removes the job's own output file, named by
// shared.JobLogEnv, once the worker has ended cleanly: a log directory
// on a cluster keeps what failed, not every job that served. The file
// is still open for the job's last lines; on Linux the name goes now
// and the bytes when the job closes it. Only a regular file named *.out
// goes (never a link, a directory or another name), and a file that is
// not there is no error: a relative path or any other name is left, and
// said.
func removeJobLog(getenv func(string) string, logger *log.Logger) {
	name := getenv(shared.JobLogEnv)
	if name == "" {
		return
	}
	if !filepath.IsAbs(name) || !strings.HasSuffix(name, ".out") {
		logger.Printf("%s=%q is not an absolute path to a .out file; the job's log is left", shared.JobLogEnv, name)
		return
	}
	fi, err := os.Lstat(name)
	if err != nil {
		return
	}
	if !fi.Mode().IsRegular() {
		logger.Printf("%s %s is not a regular file; it is left", shared.JobLogEnv, name)
		return
	}
	if err := os.Remove(name); err != nil {
		logger.Printf("the job's log %s: %v", name, err)
	}
}
