package wire

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fluksio/provision/internal/pb"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"
)

// stalledStream is the plugin's end of a host channel whose host has
// stopped reading: after the first message (Ready), Send blocks until the
// stream ends, as gRPC's does once the flow-control window is full.
type stalledStream struct {
	grpc.ServerStream
	ctx    context.Context
	hello  chan *pb.HostMessage // Recv's first answer
	mu     sync.Mutex           // guards sent
	sent   int
	closed chan struct{} // closed by end
	once   sync.Once
}

// end ends the stream; any number of calls.
func (s *stalledStream) end() { s.once.Do(func() { close(s.closed) }) }

func (s *stalledStream) Context() context.Context { return s.ctx }

func (s *stalledStream) Send(*pb.PluginMessage) error {
	s.mu.Lock()
	s.sent++
	first := s.sent == 1
	s.mu.Unlock()
	if first {
		return nil
	}
	<-s.closed
	return errors.New("stream closed")
}

func (s *stalledStream) Recv() (*pb.HostMessage, error) {
	select {
	case m := <-s.hello:
		return m, nil
	case <-s.closed:
		return nil, errors.New("stream closed")
	}
}

// TestPluginHostHonoursContextOnAStalledStream: with the host no longer
// reading, a Publish in Send, a Publish waiting behind it and a
// MintCredential each return their context's error once their deadline
// passes, not when the stream ends. Before the sender goroutine, the
// first Send held the send lock for as long as the stream stalled.
func TestPluginHostHonoursContextOnAStalledStream(t *testing.T) {
	srv := newGRPCServer(&sharedtest.Provisioner{})
	st := &stalledStream{ctx: context.Background(), hello: make(chan *pb.HostMessage, 1), closed: make(chan struct{})}
	st.hello <- &pb.HostMessage{Msg: &pb.HostMessage_Hello{Hello: &pb.Hello{Name: "n"}}}
	served := make(chan error, 1)
	go func() { served <- srv.HostChannel(st) }()
	defer func() {
		st.end()
		if err := <-served; err != nil {
			t.Logf("the host channel ended: %v", err)
		}
	}()
	// Ready is the first message: once the link has a stream, the
	// channel is up. Polled, with a deadline: attach has no signal.
	up := time.Now().Add(10 * time.Second)
	for {
		srv.link.mu.Lock()
		attached := srv.link.stream != nil
		srv.link.mu.Unlock()
		if attached {
			break
		}
		if time.Now().After(up) {
			t.Fatal("the host channel did not attach within 10s")
		}
		time.Sleep(time.Millisecond)
	}

	// The first Publish has no deadline: its event is the one stuck in
	// Send, and it waits for an acknowledgement that will not come until
	// the stream ends.
	stuck := make(chan error, 1)
	go func() { stuck <- srv.link.Publish(context.Background(), shared.Event{Kind: "first"}) }()
	waitSent(t, st, 2)

	const wait = 300 * time.Millisecond
	type result struct {
		what     string
		err      error
		deadline time.Time
		returned time.Time
	}
	results := make(chan result, 3)
	call := func(what string, f func(context.Context) error) {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		d, _ := ctx.Deadline()
		err := f(ctx)
		results <- result{what, err, d, time.Now()}
	}
	go call("a Publish behind the stuck one", func(ctx context.Context) error {
		return srv.link.Publish(ctx, shared.Event{Kind: "second"})
	})
	go call("another Publish behind the stuck one", func(ctx context.Context) error {
		return srv.link.Publish(ctx, shared.Event{Kind: "third"})
	})
	go call("MintCredential", func(ctx context.Context) error {
		_, err := srv.link.MintCredential(ctx, &shared.MintCredentialRequest{Worker: "n-a-1", CPUs: 1})
		return err
	})
	for range 3 {
		select {
		case r := <-results:
			// Returned because of the deadline, at the deadline: its
			// error says so and it came no sooner. How long after is
			// the scheduler's business, and not asserted.
			if !errors.Is(r.err, context.DeadlineExceeded) || r.returned.Before(r.deadline) {
				t.Errorf("%s: %v, %s after its deadline; want DeadlineExceeded", r.what, r.err, r.returned.Sub(r.deadline))
			} else {
				t.Logf("%s returned %s after its deadline", r.what, r.returned.Sub(r.deadline))
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a call to a stalled host was still waiting 30s after its deadline")
		}
	}
	srv.link.mu.Lock()
	seq := srv.link.seq
	srv.link.mu.Unlock()
	if seq != 1 {
		t.Errorf("seq %d after one event went out; the ones never sent gave their numbers back, so want 1", seq)
	}
	select {
	case err := <-stuck:
		t.Fatalf("the stuck Publish returned %v before the stream ended", err)
	default:
	}
	st.end()
	if err := <-stuck; !errors.Is(err, shared.ErrNoHost) {
		t.Errorf("the stuck Publish after the stream ended: %v; want ErrNoHost", err)
	}
}

// waitSent polls, with a deadline, until the stream has been sent n
// messages.
func waitSent(t *testing.T, st *stalledStream, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st.mu.Lock()
		sent := st.sent
		st.mu.Unlock()
		if sent >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages sent within 10s; want %d", sent, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestHostChannelQueueDropsWhenFull: an engine whose handler is stuck
// holds up nothing of the plugin's: with a queue of 4 and the handler
// blocked on the first event, the plugin publishes 20 events and mints a
// credential, each acknowledged at once; 15 events are dropped and
// counted (one in the handler, four queued), and the five kept reach the
// handler in order once it is released.
func TestHostChannelQueueDropsWhenFull(t *testing.T) {
	var pluginHost shared.Host
	var c *Client
	// Runs last, after inMemory's cleanup has closed the connection:
	// the channel's goroutines have an owner that waits for them.
	t.Cleanup(func() { c.WaitHostChannel() })
	c = inMemory(t, &sharedtest.Provisioner{ConfigureF: func(_ context.Context, r *shared.ConfigureRequest) (*shared.ConfigureResponse, error) {
		pluginHost = r.Host
		return &shared.ConfigureResponse{}, nil
	}})
	release := make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock) // before WaitHostChannel, even when the test fails
	five := make(chan struct{})
	inHandler := make(chan struct{}, 1)
	var mu sync.Mutex // guards got
	var got []string
	host := &blockingHost{publish: func(ev shared.Event) {
		select {
		case inHandler <- struct{}{}:
		default:
		}
		<-release
		mu.Lock()
		got = append(got, ev.Job)
		if len(got) == 5 {
			close(five)
		}
		mu.Unlock()
	}}
	var drops []int64 // guarded by mu
	err := c.OpenHostChannel(context.Background(), HostChannel{Name: "n", Host: host, Queue: 4,
		OnDrop: func(_ shared.Event, n int64) {
			mu.Lock()
			drops = append(drops, n)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Configure(context.Background(), &shared.ConfigureRequest{Name: "n"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := pluginHost.Publish(ctx, shared.Event{Kind: "k", Job: "0"}); err != nil {
		t.Fatal(err)
	}
	<-inHandler // the handler holds event 0 from here on
	for i := 1; i < 20; i++ {
		if err := pluginHost.Publish(ctx, shared.Event{Kind: "k", Job: fmt.Sprint(i)}); err != nil {
			t.Fatalf("publish %d with the handler stuck: %v", i, err)
		}
	}
	if _, err := pluginHost.MintCredential(ctx, &shared.MintCredentialRequest{Worker: "n-a", CPUs: 1}); err != nil {
		t.Fatalf("mint with the handler stuck: %v", err)
	}
	mu.Lock()
	told := len(drops)
	mu.Unlock()
	if n := c.DroppedEvents(); n != 15 || told != 15 {
		t.Errorf("%d dropped (%d told); want 15", n, told)
	}
	unblock()
	select {
	case <-five:
	case <-time.After(10 * time.Second):
		t.Fatal("the kept events did not reach the handler within 10s of its release")
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"0", "1", "2", "3", "4"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the handler got %v; want %v", got, want)
	}
}

// blockingHost is a Host whose Publish runs publish and whose mints are
// granted at once.
type blockingHost struct {
	publish func(shared.Event)
}

func (h *blockingHost) Publish(_ context.Context, ev shared.Event) error {
	h.publish(ev)
	return nil
}

func (h *blockingHost) MintCredential(context.Context, *shared.MintCredentialRequest) (*shared.MintCredentialResponse, error) {
	return &shared.MintCredentialResponse{Token: "t", Expires: time.Now().Add(time.Hour)}, nil
}

// guardingHost mints for workers named "n-…" only, as the engine's guard
// does for provisioner n, and counts the mints it was asked for.
type guardingHost struct {
	mu    sync.Mutex // guards asked
	asked []string
}

func (h *guardingHost) Publish(context.Context, shared.Event) error { return nil }

func (h *guardingHost) MintCredential(_ context.Context, r *shared.MintCredentialRequest) (*shared.MintCredentialResponse, error) {
	h.mu.Lock()
	h.asked = append(h.asked, r.Worker)
	h.mu.Unlock()
	if len(r.Worker) < 3 || r.Worker[:2] != "n-" {
		return nil, fmt.Errorf("%w: worker %q is not provisioner n's", shared.ErrPermissionDenied, r.Worker)
	}
	return &shared.MintCredentialResponse{Token: "token-of-" + r.Worker, Expires: time.Unix(1700000000, 0)}, nil
}

// hostChannelPair opens a host channel to an in-memory plugin with host
// as the engine's end, saying contract and caps in Hello (this package's
// own for an empty contract), and returns the Host the plugin was handed.
func hostChannelPair(t *testing.T, host shared.Host, contract string, caps ...shared.Capability) shared.Host {
	t.Helper()
	var pluginHost shared.Host
	var c *Client
	t.Cleanup(func() { c.WaitHostChannel() })
	c = inMemory(t, &sharedtest.Provisioner{ConfigureF: func(_ context.Context, r *shared.ConfigureRequest) (*shared.ConfigureResponse, error) {
		pluginHost = r.Host
		return &shared.ConfigureResponse{}, nil
	}})
	if err := c.OpenHostChannel(context.Background(), HostChannel{Name: "n", Host: host, Contract: contract, Capabilities: caps}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Configure(context.Background(), &shared.ConfigureRequest{Name: "n"}); err != nil {
		t.Fatal(err)
	}
	return pluginHost
}

func mintItems(names ...string) *shared.MintCredentialsRequest {
	req := &shared.MintCredentialsRequest{}
	for _, n := range names {
		req.Items = append(req.Items, &shared.MintCredentialRequest{Worker: n, TTL: time.Hour, CPUs: 1})
	}
	return req
}

// TestBatchMint: one request names several workers and one answer
// carries a credential for each, in order; a name that is not the
// provisioner's is refused on its own (its neighbours are signed), and
// every item went through the host's guard. A batch over the cap, an
// empty one and one naming a worker twice are refused whole, before the
// guard signs anything.
func TestBatchMint(t *testing.T) {
	host := &guardingHost{}
	ph := hostChannelPair(t, host, "")
	bm, ok := ph.(shared.BatchMinter)
	if !ok {
		t.Fatal("the plugin's Host is not a BatchMinter")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := bm.MintCredentials(ctx, mintItems("n-a", "other-b", "n-c"))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Items) != 3 {
		t.Fatalf("%d answers for 3 items", len(r.Items))
	}
	for i, want := range []string{"token-of-n-a", "", "token-of-n-c"} {
		it := r.Items[i]
		if want == "" {
			if !errors.Is(it.Err, shared.ErrPermissionDenied) || it.Credential != nil {
				t.Errorf("item %d: %+v, %v; want refused with permission denied", i, it.Credential, it.Err)
			}
			continue
		}
		if it.Err != nil || it.Credential == nil || it.Credential.Token != want || !it.Credential.Expires.Equal(time.Unix(1700000000, 0)) {
			t.Errorf("item %d: %+v, %v; want token %s", i, it.Credential, it.Err, want)
		}
	}
	host.mu.Lock()
	asked := fmt.Sprint(host.asked)
	host.asked = nil
	host.mu.Unlock()
	if asked != "[n-a other-b n-c]" {
		t.Errorf("the guard was asked %s; want every item, in order", asked)
	}

	names := make([]string, shared.MaxMintBatch+1)
	for i := range names {
		names[i] = fmt.Sprintf("n-w%d", i)
	}
	for _, tc := range []struct {
		what string
		req  *shared.MintCredentialsRequest
	}{
		{"over the cap", mintItems(names...)},
		{"empty", mintItems()},
		{"a worker twice", mintItems("n-a", "n-b", "n-a")},
	} {
		if _, err := bm.MintCredentials(ctx, tc.req); !errors.Is(err, shared.ErrInvalidArgument) {
			t.Errorf("%s: %v; want invalid argument", tc.what, err)
		}
	}
	host.mu.Lock()
	if len(host.asked) != 0 {
		t.Errorf("a batch refused whole had %d items signed", len(host.asked))
	}
	host.mu.Unlock()
	// At the cap exactly, all are signed; shared.MintCredentials chunks a
	// larger burst at the cap.
	r, err = shared.MintCredentials(ctx, ph, mintItems(names...))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Items) != len(names) || r.Items[len(names)-1].Credential.Token != "token-of-"+names[len(names)-1] {
		t.Errorf("%d answers for %d items", len(r.Items), len(names))
	}
}

// TestBatchMintFallsBackOnAnOlderHost: a host that does not offer
// batch_mint does not answer a batch (it does not know the message, and
// this one ignores it as such a host does), so a plugin that sent one
// would wait for its deadline; the plugin reads the host's capabilities
// from Hello and mints one at a time instead. A host of 2.4, which could
// not declare, offers it; one of 2.3 or 2.5 offers what it declares.
func TestBatchMintFallsBackOnAnOlderHost(t *testing.T) {
	for _, tc := range []struct {
		contract string
		caps     []shared.Capability
		batch    bool
	}{
		{"", nil, true}, // this package's own Hello
		{"2.3", nil, false},
		{"2.3", []shared.Capability{shared.CapabilityBatchMint}, true},
		{"2.4", nil, true},
		{"2.5", nil, false},
		{"2.5", []shared.Capability{shared.CapabilityReconcileDelta}, false},
		{"2.5", []shared.Capability{"something_new", shared.CapabilityBatchMint}, true},
	} {
		host := &guardingHost{}
		ph := hostChannelPair(t, host, tc.contract, tc.caps...)
		link := ph.(*pluginLink)
		link.mu.Lock()
		batch := link.hostBatch
		link.mu.Unlock()
		if batch != tc.batch {
			t.Errorf("a host of %q declaring %v: the plugin batch-mints %v; want %v", tc.contract, tc.caps, batch, tc.batch)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		r, err := shared.MintCredentials(ctx, ph, mintItems("n-a", "other-b", "n-c"))
		cancel()
		if err != nil {
			t.Fatalf("against a host of %q declaring %v: %v", tc.contract, tc.caps, err)
		}
		if len(r.Items) != 3 || r.Items[0].Credential.Token != "token-of-n-a" || !errors.Is(r.Items[1].Err, shared.ErrPermissionDenied) || r.Items[2].Credential.Token != "token-of-n-c" {
			t.Errorf("answers %+v", r.Items)
		}
	}
}

// recordingHost keeps the events it is given, in order.
type recordingHost struct {
	guardingHost
	evMu sync.Mutex // guards evs
	evs  []shared.Event
}

func (h *recordingHost) Publish(_ context.Context, ev shared.Event) error {
	h.evMu.Lock()
	h.evs = append(h.evs, ev)
	h.evMu.Unlock()
	return nil
}

// TestPublishAll: events published back to back reach the host in order,
// numbered on from the events before them, and PublishAll returns once
// each is acknowledged, so all are with the host when it does.
func TestPublishAll(t *testing.T) {
	host := &recordingHost{}
	ph := hostChannelPair(t, host, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := ph.Publish(ctx, shared.Event{Kind: "k", Job: "first"}); err != nil {
		t.Fatal(err)
	}
	var evs []shared.Event
	for i := range 500 {
		evs = append(evs, shared.Event{Kind: "k", Job: fmt.Sprint(i)})
	}
	if err := shared.PublishAll(ctx, ph, evs); err != nil {
		t.Fatal(err)
	}
	// Acknowledged means queued for the handler; the dispatcher hands
	// them on in order. Polled, with a deadline.
	deadline := time.Now().Add(10 * time.Second)
	for {
		host.evMu.Lock()
		n := len(host.evs)
		host.evMu.Unlock()
		if n == 501 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	host.evMu.Lock()
	defer host.evMu.Unlock()
	if len(host.evs) != 501 {
		t.Fatalf("the host has %d events; want 501", len(host.evs))
	}
	for i, ev := range host.evs[1:] {
		if ev.Job != fmt.Sprint(i) || ev.Seq != uint64(i+2) {
			t.Fatalf("event %d: job %s seq %d; want job %d seq %d", i, ev.Job, ev.Seq, i, i+2)
		}
	}
}

// TestBurstOfTenThousandKept: a plugin's burst of 10,000 events, sent
// back to back (PublishAll) while the engine's handler is stuck, is kept
// whole by the default queue and handed on in order once the handler
// moves: a burst of 10,000 array tasks has one event each (issue 30).
func TestBurstOfTenThousandKept(t *testing.T) {
	const n = 10000
	var pluginHost shared.Host
	c := inMemory(t, &sharedtest.Provisioner{ConfigureF: func(_ context.Context, r *shared.ConfigureRequest) (*shared.ConfigureResponse, error) {
		pluginHost = r.Host
		return &shared.ConfigureResponse{}, nil
	}})
	release := make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock)
	all := make(chan struct{})
	var mu sync.Mutex // guards got
	var got []string
	host := &blockingHost{publish: func(ev shared.Event) {
		<-release
		mu.Lock()
		got = append(got, ev.Job)
		if len(got) == n {
			close(all)
		}
		mu.Unlock()
	}}
	if err := c.OpenHostChannel(context.Background(), HostChannel{Name: "n", Host: host}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Configure(context.Background(), &shared.ConfigureRequest{Name: "n"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	evs := make([]shared.Event, n)
	for i := range evs {
		evs[i] = shared.Event{Kind: "k", Job: fmt.Sprint(i)}
	}
	if err := shared.PublishAll(ctx, pluginHost, evs); err != nil {
		t.Fatal(err)
	}
	if d := c.DroppedEvents(); d != 0 {
		t.Fatalf("%d of a burst of %d dropped with the handler stuck", d, n)
	}
	unblock()
	select {
	case <-all:
	case <-ctx.Done():
		t.Fatal("the burst did not reach the handler")
	}
	mu.Lock()
	defer mu.Unlock()
	for i, j := range got {
		if j != fmt.Sprint(i) {
			t.Fatalf("event %d handed on as job %s: out of order", i, j)
		}
	}
}

// TestEventQueueBoundsBytes: the queue between the host channel's reader
// and its dispatcher refuses an event that would take what waits past
// its bytes, however few events wait, and takes room back as events
// are taken: with room for 10 KB, two events of a 4 KB detail fit and a
// third does not, and it fits once one is taken.
func TestEventQueueBoundsBytes(t *testing.T) {
	q := newEventQueue(DefaultEventQueue, 10<<10)
	big := shared.Event{Kind: "k", Detail: strings.Repeat("x", MaxEventDetail)}
	for i := range 2 {
		if !q.put(big) {
			t.Fatalf("event %d of 4 KB did not fit in 10 KB", i+1)
		}
	}
	if q.put(big) {
		t.Fatalf("a third event of 4 KB fit: %d bytes wait; bound %d", q.bytes, q.maxBytes)
	}
	if _, ok := q.take(); !ok || !q.put(big) {
		t.Fatalf("no room after a take: %d bytes wait", q.bytes)
	}
	for range 2 {
		q.take()
	}
	if q.bytes != 0 {
		t.Errorf("an empty queue counts %d bytes", q.bytes)
	}
}

// TestHostChannelClipsBeforeQueueing: an event of 1 MB of detail, within
// the message cap, reaches the Host cut to MaxEventDetail: the queue
// holds what the engine keeps, not what the plugin sent.
func TestHostChannelClipsBeforeQueueing(t *testing.T) {
	var pluginHost shared.Host
	var c *Client
	t.Cleanup(func() { c.WaitHostChannel() })
	c = inMemory(t, &sharedtest.Provisioner{ConfigureF: func(_ context.Context, r *shared.ConfigureRequest) (*shared.ConfigureResponse, error) {
		pluginHost = r.Host
		return &shared.ConfigureResponse{}, nil
	}})
	got := make(chan shared.Event, 1)
	if err := c.OpenHostChannel(context.Background(), HostChannel{Name: "n", Host: &blockingHost{publish: func(ev shared.Event) { got <- ev }}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Configure(context.Background(), &shared.ConfigureRequest{Name: "n"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := pluginHost.Publish(ctx, shared.Event{Kind: "k", Detail: strings.Repeat("x", 1<<20)}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-got:
		if len(ev.Detail) > MaxEventDetail+64 {
			t.Errorf("the Host got %d bytes of detail; want at most %d and the note of the cut", len(ev.Detail), MaxEventDetail)
		}
	case <-ctx.Done():
		t.Fatal("the event did not reach the Host within 20 s")
	}
}
