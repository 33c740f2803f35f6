package supervise

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/testutil"
)

var (
	buildOnce  sync.Once
	pluginPath string
	buildErr   error
)

// testPlugin builds examples/testplugin once per test binary and returns
// its path. The tests launch it as a real subprocess, the way an engine
// would.
func testPlugin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "testplugin")
		if err != nil {
			buildErr = err
			return
		}
		pluginPath = filepath.Join(dir, "testplugin")
		out, err := exec.Command("go", "build", "-o", pluginPath, "github.com/fluksio/provision/examples/testplugin").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("building the test plugin: %v", buildErr)
	}
	return pluginPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if pluginPath != "" {
		os.RemoveAll(filepath.Dir(pluginPath))
	}
	os.Exit(code)
}

// syncBuffer is a buffer goroutines write while the test reads it.
type syncBuffer = testutil.Buffer

type signerFunc func(host.CredentialClaims, time.Duration) (string, time.Time, error)

func (f signerFunc) Sign(c host.CredentialClaims, ttl time.Duration) (string, time.Time, error) {
	return f(c, ttl)
}

func nullLogger() hclog.Logger { return hclog.NewNullLogger() }

// alive reports whether a process exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}

// sendsChanges reports whether tr, a Supervisor's tracker, sends a
// plugin changes rather than whole lists: a copy of it is answered a
// whole list and asked again at once. tr itself is not touched.
func sendsChanges(tr *host.AttachedTracker) bool {
	c := *tr
	now := time.Now()
	req := c.Request([]string{"a"}, now)
	c.Answered(req, true, now)
	return c.Request([]string{"a", "b"}, now).Delta
}
