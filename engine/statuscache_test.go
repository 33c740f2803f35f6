package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
)

// TestStatusCacheFetchesOnceAndTrims: callers at once share one fetch,
// and a huge outstanding list is cut to maxStatusOutstanding with its
// total kept.
func TestStatusCacheFetchesOnceAndTrims(t *testing.T) {
	t.Parallel()
	var c statusCache
	var fetches atomic.Int32
	release := make(chan struct{})
	fetch := func(context.Context) []host.ProvisionerStatus {
		fetches.Add(1)
		<-release
		st := &shared.StatusResponse{Outstanding: make([]shared.Outstanding, 5000)}
		return []host.ProvisionerStatus{{Name: "hpc", Status: st}}
	}
	var wg sync.WaitGroup
	got := make([][]host.ProvisionerStatus, 16)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = c.get(context.Background(), fetch)
		}()
	}
	close(release)
	wg.Wait()
	if n := fetches.Load(); n != 1 {
		t.Errorf("%d fetches for 16 callers at once; want 1", n)
	}
	for _, g := range got {
		if len(g) != 1 || g[0].OutstandingTotal != 5000 || len(g[0].Status.Outstanding) != maxStatusOutstanding {
			t.Fatalf("got %d provisioners, total %d, listed %d", len(g), g[0].OutstandingTotal, len(g[0].Status.Outstanding))
		}
	}
}
