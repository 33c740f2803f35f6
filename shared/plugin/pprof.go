package plugin

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"
)

// HeapProfileDirEnv names the environment variable that turns on heap
// profiles on demand: with it set to a directory, the plugin writes its
// heap profile there, as heap-PID-N.pprof (N counting from 1), each time
// it receives SIGUSR1, after a garbage collection so that the profile is
// of what the process holds now. The soak sets it (SOAK_PPROF) to read
// what grew in a plugin between the start of a run and its end with `go
// tool pprof -diff_base`. A plugin has no port of its own to serve
// net/http/pprof on, and a signal asks for nothing over the contract;
// without the variable SIGUSR1 is not caught.
const HeapProfileDirEnv = "FLUKSIO_PLUGIN_PPROF_DIR"

// profileRate is runtime.MemProfileRate while heap profiles are on.
const profileRate = 16 << 10

// heapProfilesOnSignal writes a heap profile into dir on each SIGUSR1
// until stop is called; dir "" does nothing.
func heapProfilesOnSignal(dir string, logger hclog.Logger) (stop func()) {
	if dir == "" {
		return func() {}
	}
	// A sample every 16 KiB allocated rather than the runtime's 512 KiB:
	// a plugin's heap is a few MB, which the default samples too coarsely
	// for a diff between two profiles to name what grew.
	runtime.MemProfileRate = profileRate
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGUSR1)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 1; ; n++ {
			select {
			case <-done:
				return
			case <-sigs:
			}
			path := filepath.Join(dir, fmt.Sprintf("heap-%d-%d.pprof", os.Getpid(), n))
			if err := writeHeapProfile(path); err != nil {
				logger.Warn("writing a heap profile", "path", path, "error", err)
				continue
			}
			logger.Info("wrote a heap profile", "path", path)
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
		wg.Wait()
	}
}

// writeHeapProfile writes the heap profile to path whole or not at all:
// it is written beside path and renamed, so that a reader waiting for
// path never reads half of one.
func writeHeapProfile(path string) error {
	runtime.GC()
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	err = pprof.WriteHeapProfile(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
