package engine

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"syscall"
	"time"

	"github.com/fluksio/provision/worker"
)

// ErrEngineListening is ServeProbe's error when the engine's address is
// taken: most likely by the engine itself, which answers the probe too.
var ErrEngineListening = errors.New("the engine's listen address is in use")

// ServeProbe serves the engine's answer to a reach probe (ServeProbe the
// handler, worker.ProbePath) where the engine block says it listens, and
// with its TLS, for the time a validate -check -probe runs: the probe's
// worker on a compute node dials engine_url, which leads there. stop
// ends it. An address in use is ErrEngineListening: a running engine
// answers the probe itself.
func (e *EngineBlock) ServeProbe() (stop func(), err error) {
	ln, _, err := Listen(e.Listen)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, ErrEngineListening
		}
		return nil, err
	}
	if cfg := e.ServerTLS(); cfg != nil {
		ln = tls.NewListener(ln, cfg)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+worker.ProbePath, ServeProbe)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
