package wire

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/internal/pb"
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
