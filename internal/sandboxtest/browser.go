package sandboxtest

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"testing"

	"github.com/chromedp/chromedp"
)

// Browser starts Debian's chromium, headless, for one test or benchmark,
// and closes it when tb ends. Without chromium, tb skips, and fails in CI,
// where .ci/run installs it.
func Browser(tb testing.TB) context.Context {
	tb.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		msg := "chromium is not installed (apt-get install chromium)"
		if os.Getenv("CI") != "" {
			tb.Fatal(msg + " (in CI this is a failure, not a skip)")
		}
		tb.Skip(msg)
	}
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(path),
		// As root (the sandbox needs it), chromium refuses to start
		// with its own sandbox.
		chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(tb.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	tb.Cleanup(func() { cancel(); cancelAlloc() })
	return ctx
}
