package engine

import (
	"context"
	"sync"
	"time"

	"github.com/fluksio/provision/engine/host"
)

// An operator's status page is read by anyone who can reach it (a curl
// has no worker credential), and it asks every plugin for its Status,
// which crosses a process boundary and may be large: served naively,
// each concurrent request holds a copy of every plugin's whole status.
// So statusCache fetches the plugins' status at most once per
// statusMaxAge, by one caller while the others wait for it, and keeps at
// most maxStatusOutstanding entries per provisioner (the total is still
// reported). What the engine holds in memory itself it can read fresh.
// GET /status and the metrics share one (statusPage.cache).

const (
	// statusMaxAge is how stale the plugins' part of /status may be. An
	// operator refreshing a page cannot tell a second; a flood of
	// requests then costs one plugin call per second.
	statusMaxAge = time.Second
	// statusFetchTimeout bounds one fetch, whoever asked for it: the
	// fetch is shared, so it does not run on any one request's context.
	statusFetchTimeout = 10 * time.Second
	// maxStatusOutstanding is how many outstanding jobs per provisioner
	// get keeps; OutstandingTotal says how many there were.
	maxStatusOutstanding = 1000
)

// statusCache holds the last fetch of the provisioners' status. Its zero
// value is ready to use.
type statusCache struct {
	mu sync.Mutex // guards the fields below; never held across a fetch
	// provs is the last fetch, taken at at.
	provs []host.ProvisionerStatus
	at    time.Time
	// fetching is closed when the fetch in progress ends; nil when none is.
	fetching chan struct{}
}

// get returns the provisioners' status, no older than statusMaxAge, or
// fetches it with fetch. Only one fetch runs at a time; other callers wait
// for it, or for ctx.
func (c *statusCache) get(ctx context.Context, fetch func(context.Context) []host.ProvisionerStatus) []host.ProvisionerStatus {
	c.mu.Lock()
	for {
		if c.fetching == nil && c.provs != nil && time.Since(c.at) < statusMaxAge {
			provs := c.provs
			c.mu.Unlock()
			return provs
		}
		if c.fetching == nil {
			break
		}
		wait := c.fetching
		c.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			c.mu.Lock()
			provs := c.provs
			c.mu.Unlock()
			return provs
		}
		c.mu.Lock()
		if c.provs != nil && time.Since(c.at) < statusMaxAge {
			provs := c.provs
			c.mu.Unlock()
			return provs
		}
	}
	done := make(chan struct{})
	c.fetching = done
	c.mu.Unlock()

	fctx, cancel := context.WithTimeout(context.Background(), statusFetchTimeout)
	provs := trimStatus(fetch(fctx))
	cancel()

	c.mu.Lock()
	c.provs, c.at, c.fetching = provs, time.Now(), nil
	c.mu.Unlock()
	close(done)
	return provs
}

// trimStatus cuts each provisioner's outstanding list to
// maxStatusOutstanding, keeping the count. The cached value is shared by
// every reader, so it is never changed after this.
func trimStatus(provs []host.ProvisionerStatus) []host.ProvisionerStatus {
	if provs == nil {
		provs = []host.ProvisionerStatus{}
	}
	for i := range provs {
		s := provs[i].Status
		if s == nil {
			continue
		}
		provs[i].OutstandingTotal = len(s.Outstanding)
		if len(s.Outstanding) > maxStatusOutstanding {
			cp := *s
			cp.Outstanding = append(cp.Outstanding[:0:0], s.Outstanding[:maxStatusOutstanding]...)
			provs[i].Status = &cp
		}
	}
	return provs
}
