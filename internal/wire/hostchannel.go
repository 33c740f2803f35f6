package wire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fluksio/provision/internal/clip"
	"github.com/fluksio/provision/internal/pb"
	"github.com/fluksio/provision/shared"
)

// The host channel is the plugin's way back to the engine: one
// bidirectional stream that the host opens, over which the plugin sends
// events and credential requests and the host answers each. It is plain
// gRPC, so a plugin in any language can implement it; go-plugin's broker
// would have done the same for Go only, at the cost of a second listener
// and a five-second dial timeout nobody outside Go can see.
//
// Neither end may be stalled by the other's slowness. On the host, one
// goroutine reads the stream and answers at once: an event goes into a
// bounded queue that a dispatcher of this channel's own drains into the
// engine's handler, and is acknowledged when queued, so an engine's slow
// handler holds up only that plugin's later events, never its credential
// requests nor any other plugin. On the plugin, one sender goroutine per
// stream owns Send (which gRPC serialises and which ignores contexts),
// and Publish and MintCredential hand their message to it and wait for
// the answer within their own context.
//
// A full queue (DefaultEventQueue events, or DefaultEventQueueBytes of
// them) drops the event, counts it (Client.DroppedEvents) and
// acknowledges it all the same: the reader cannot wait for room without
// holding up credential requests, and a plugin's events are reports
// (docs/design/wire-event-queue.md).

// DefaultEventQueue is how many events of one plugin may wait for the
// engine's handler: a burst of submissions ten thousand strong, each with
// its event, fits, since the reader takes them off the wire faster than a
// handler is handed them. The queue takes memory only for what waits in
// it (eventQueue).
const DefaultEventQueue = 16384

// DefaultEventQueueBytes bounds the same queue by the size of what waits
// in it, so that a queue full of the largest events a plugin may send
// stays small, while a burst of ten thousand ordinary ones still fits.
const DefaultEventQueueBytes = 8 << 20

// eventOverhead is what an event costs in the queue beyond its strings.
const eventOverhead = 64

// eventBytes is what ev costs in the queue.
func eventBytes(ev shared.Event) int {
	return eventOverhead + len(ev.Kind) + len(ev.Provisioner) + len(ev.Profile) + len(ev.Job) + len(ev.Worker) + len(ev.Detail) + len(ev.Class)
}

// eventQueue is the bounded queue between the host channel's reader and
// its dispatcher. A buffered channel of DefaultEventQueue events would
// hold its whole size in memory for every plugin from the start; this
// holds what waits.
type eventQueue struct {
	limit    int
	maxBytes int
	// ready holds one token while there is something to take or the
	// queue is closed; a put or close never blocks on it.
	ready chan struct{}
	// mu guards items, bytes and closed; it is held only to change them.
	mu     sync.Mutex
	items  []shared.Event
	bytes  int // eventBytes of items
	closed bool
}

func newEventQueue(limit, maxBytes int) *eventQueue {
	return &eventQueue{limit: limit, maxBytes: maxBytes, ready: make(chan struct{}, 1)}
}

func (q *eventQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// put queues ev; false when the queue is full, by count or by bytes.
func (q *eventQueue) put(ev shared.Event) bool {
	size := eventBytes(ev)
	q.mu.Lock()
	if len(q.items) >= q.limit || q.bytes+size > q.maxBytes {
		q.mu.Unlock()
		return false
	}
	q.items = append(q.items, ev)
	q.bytes += size
	q.mu.Unlock()
	q.signal()
	return true
}

// close lets take return false once the queue is empty.
func (q *eventQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
}

// take waits for the oldest event; false once the queue is closed and
// empty.
func (q *eventQueue) take() (shared.Event, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			ev := q.items[0]
			q.items[0] = shared.Event{}
			q.items = q.items[1:]
			q.bytes -= eventBytes(ev)
			if len(q.items) == 0 {
				q.items = nil // the backing array goes with the burst
			} else {
				defer q.signal() // more to take
			}
			q.mu.Unlock()
			return ev, true
		}
		closed := q.closed
		q.mu.Unlock()
		if closed {
			return shared.Event{}, false
		}
		<-q.ready
	}
}

// helloTimeout bounds how long the host waits for a plugin to answer
// Hello. A plugin that takes longer is broken, not busy.
const helloTimeout = 10 * time.Second

// pluginLink is the plugin's end of the host channel and the Host that the
// SDK hands to the implementation. It survives the stream: before the
// host connects, and after it disconnects, calls fail with ErrNoHost.
type pluginLink struct {
	// turn is a lock taken with a context (a one-slot channel): it keeps
	// event numbers in the order the events reach the sender. It is held
	// across the handoff to the sender, which a stalled stream can hold
	// up, so it is taken and waited on within the caller's context;
	// never across a Send or a wait for the host's answer.
	turn chan struct{}

	mu      sync.Mutex // guards everything below
	stream  pb.Provisioner_HostChannelServer
	out     chan *pb.PluginMessage // the current stream's sender takes from it
	gone    chan struct{}          // closed when the current stream ends
	seq     uint64
	nextID  uint64
	acks    map[uint64]chan struct{}
	credits map[uint64]chan *pb.Credential
	batches map[uint64]chan *pb.Credentials
	// hostBatch says the current stream's host offers
	// CapabilityBatchMint (its Hello): another host would not answer a
	// batch mint.
	hostBatch bool
}

var (
	_ shared.Host           = (*pluginLink)(nil)
	_ shared.BatchMinter    = (*pluginLink)(nil)
	_ shared.BatchPublisher = (*pluginLink)(nil)
)

func newPluginLink() *pluginLink {
	return &pluginLink{turn: make(chan struct{}, 1), acks: map[uint64]chan struct{}{}, credits: map[uint64]chan *pb.Credential{},
		batches: map[uint64]chan *pb.Credentials{}}
}

// HostChannel serves the stream for as long as the host keeps it open.
func (s *grpcServer) HostChannel(stream pb.Provisioner_HostChannelServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if first.GetHello() == nil {
		return status.Error(codes.InvalidArgument, "the host channel must start with Hello")
	}
	out := make(chan *pb.PluginMessage)
	hello := first.GetHello()
	batch := shared.HasCapability(hello.GetContractVersion(), capabilitiesFromProto(hello.GetCapabilities()), shared.CapabilityBatchMint)
	gone := s.link.attach(stream, out, batch)
	sent := make(chan struct{})
	// The sender is the stream's only caller of Send. It ends when the
	// stream does (gone), or when a Send fails, which it does once the
	// stream's context ends; this handler waits for it.
	go func() {
		defer close(sent)
		for {
			select {
			case msg := <-out:
				if stream.Send(msg) != nil {
					return
				}
			case <-gone:
				return
			}
		}
	}()
	defer func() {
		s.link.detach(stream, gone)
		<-sent
	}()
	ready := &pb.PluginMessage{Msg: &pb.PluginMessage_Ready{Ready: &pb.Ready{}}}
	if err := handoff(stream.Context(), out, gone, ready); err != nil {
		return err
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		switch m := msg.GetMsg().(type) {
		case *pb.HostMessage_EventAck:
			s.link.deliverAck(m.EventAck.GetSeq())
		case *pb.HostMessage_Credential:
			s.link.deliverCredential(m.Credential)
		case *pb.HostMessage_Credentials:
			s.link.deliverCredentials(m.Credentials)
		}
	}
}

func (l *pluginLink) attach(stream pb.Provisioner_HostChannelServer, out chan *pb.PluginMessage, hostBatch bool) chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stream, l.out, l.hostBatch = stream, out, hostBatch
	l.gone = make(chan struct{})
	return l.gone
}

// detach forgets a stream that ended. Callers still waiting on it see the
// gone channel close and fail with ErrNoHost.
func (l *pluginLink) detach(stream pb.Provisioner_HostChannelServer, gone chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stream == stream {
		l.stream, l.out, l.hostBatch = nil, nil, false
	}
	close(gone)
}

// handoff gives msg to a stream's sender, waiting for it no longer than
// ctx allows or the stream lasts.
func handoff(ctx context.Context, out chan<- *pb.PluginMessage, gone <-chan struct{}, msg *pb.PluginMessage) error {
	select {
	case out <- msg:
		return nil
	case <-gone:
		return fmt.Errorf("%w: the host went away", shared.ErrNoHost)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *pluginLink) deliverAck(seq uint64) {
	l.mu.Lock()
	ch, ok := l.acks[seq]
	delete(l.acks, seq)
	l.mu.Unlock()
	if ok {
		close(ch)
	}
}

func (l *pluginLink) deliverCredential(c *pb.Credential) {
	l.mu.Lock()
	ch, ok := l.credits[c.GetRequestId()]
	delete(l.credits, c.GetRequestId())
	l.mu.Unlock()
	if ok {
		ch <- c // buffered: the waiter may have given up
	}
}

func (l *pluginLink) deliverCredentials(c *pb.Credentials) {
	l.mu.Lock()
	ch, ok := l.batches[c.GetRequestId()]
	delete(l.batches, c.GetRequestId())
	l.mu.Unlock()
	if ok {
		ch <- c // buffered: the waiter may have given up
	}
}

// Publish sends an event and waits for the host to acknowledge it, so a
// plugin that returns from Publish knows the engine has it (queued for
// its handler; see the top of this file for a full queue). It returns
// ctx's error once ctx ends, whatever the stream is doing; an event
// handed over before then may still arrive.
func (l *pluginLink) Publish(ctx context.Context, ev shared.Event) error {
	return l.publish(ctx, []shared.Event{ev}, string(ev.Kind))
}

// PublishAll hands evs to the sender in order, numbered as Publish
// numbers them, without waiting between them, and then waits for every
// acknowledgement: a thousand events cost about one round trip, not a
// thousand.
func (l *pluginLink) PublishAll(ctx context.Context, evs []shared.Event) error {
	if len(evs) == 0 {
		return nil
	}
	return l.publish(ctx, evs, fmt.Sprintf("%d events", len(evs)))
}

// publish is Publish and PublishAll: what names the events in errors.
// The turn is held across the handoffs only, so no other event is
// numbered in between, and not while waiting for the acknowledgements.
func (l *pluginLink) publish(ctx context.Context, evs []shared.Event, what string) error {
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("waiting to publish %s: %w", what, ctx.Err())
	}
	l.mu.Lock()
	if l.stream == nil {
		l.mu.Unlock()
		<-l.turn
		return fmt.Errorf("%w: cannot publish %s", shared.ErrNoHost, what)
	}
	out, gone := l.out, l.gone
	l.mu.Unlock()
	acks := make([]chan struct{}, 0, len(evs))
	seqs := make([]uint64, 0, len(evs))
	var sendErr error
	for _, ev := range evs {
		l.mu.Lock()
		l.seq++
		ev.Seq = l.seq
		acked := make(chan struct{})
		l.acks[ev.Seq] = acked
		l.mu.Unlock()
		if err := handoff(ctx, out, gone, &pb.PluginMessage{Msg: &pb.PluginMessage_Event{Event: eventToProto(ev)}}); err != nil {
			// Never sent: the number is given back (no one else took
			// one, as this caller holds the turn), so the host sees no
			// gap. Those handed over before it are still waited for.
			l.mu.Lock()
			delete(l.acks, ev.Seq)
			l.seq--
			l.mu.Unlock()
			sendErr = fmt.Errorf("publishing %s: %w", ev.Kind, err)
			break
		}
		acks, seqs = append(acks, acked), append(seqs, ev.Seq)
	}
	<-l.turn
	forget := func() {
		l.mu.Lock()
		for _, s := range seqs {
			delete(l.acks, s)
		}
		l.mu.Unlock()
	}
	for _, acked := range acks {
		select {
		case <-acked:
		case <-gone:
			forget()
			return fmt.Errorf("%w: the host went away before acknowledging %s", shared.ErrNoHost, what)
		case <-ctx.Done():
			forget()
			return ctx.Err()
		}
	}
	return sendErr
}

// MintCredential asks the host to sign a credential and waits for it,
// no longer than ctx allows.
func (l *pluginLink) MintCredential(ctx context.Context, req *shared.MintCredentialRequest) (*shared.MintCredentialResponse, error) {
	l.mu.Lock()
	if l.stream == nil {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: cannot mint a credential", shared.ErrNoHost)
	}
	l.nextID++
	id := l.nextID
	answer := make(chan *pb.Credential, 1)
	l.credits[id] = answer
	out, gone := l.out, l.gone
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.credits, id)
		l.mu.Unlock()
	}()

	m := mintToProto(req)
	m.RequestId = id
	err := handoff(ctx, out, gone, &pb.PluginMessage{Msg: &pb.PluginMessage_MintCredential{MintCredential: m}})
	if err != nil {
		return nil, fmt.Errorf("asking for a credential: %w", err)
	}
	select {
	case c := <-answer:
		return credentialFromProto(c)
	case <-gone:
		return nil, fmt.Errorf("%w: the host went away before answering", shared.ErrNoHost)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func mintToProto(req *shared.MintCredentialRequest) *pb.MintCredential {
	return &pb.MintCredential{
		Worker: req.Worker, TtlSeconds: req.TTL.Seconds(),
		Cpus: int32(req.CPUs), Gpus: int32(req.GPUs), RamMb: req.RAMMB, Labels: req.Labels,
	}
}

func mintFromProto(m *pb.MintCredential) *shared.MintCredentialRequest {
	return &shared.MintCredentialRequest{
		Worker: m.GetWorker(),
		TTL:    secondsToDuration(m.GetTtlSeconds()),
		CPUs:   int(m.GetCpus()),
		GPUs:   int(m.GetGpus()),
		RAMMB:  m.GetRamMb(),
		Labels: m.GetLabels(),
	}
}

func credentialFromProto(c *pb.Credential) (*shared.MintCredentialResponse, error) {
	if c.GetErrorCode() != 0 {
		return nil, fromStatus(status.Error(codes.Code(c.GetErrorCode()), c.GetErrorMessage()), false)
	}
	return &shared.MintCredentialResponse{Token: c.GetToken(), Expires: fromUnixNano(c.GetExpiresUnixNano())}, nil
}

// MintCredentials asks the host for many credentials in one round trip
// when the host's Hello offers CapabilityBatchMint, and one
// MintCredential at a time otherwise: another host ignores a message it
// does not know, and the plugin would wait for an answer that never
// comes. Callers chunk at shared.MaxMintBatch (shared.MintCredentials
// does); a larger batch is sent as it is, and refused by the host.
func (l *pluginLink) MintCredentials(ctx context.Context, req *shared.MintCredentialsRequest) (*shared.MintCredentialsResponse, error) {
	l.mu.Lock()
	if l.stream == nil {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: cannot mint credentials", shared.ErrNoHost)
	}
	if !l.hostBatch {
		l.mu.Unlock()
		return shared.MintCredentials(ctx, oneAtATime{l}, req)
	}
	l.nextID++
	id := l.nextID
	answer := make(chan *pb.Credentials, 1)
	l.batches[id] = answer
	out, gone := l.out, l.gone
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.batches, id)
		l.mu.Unlock()
	}()

	items := make([]*pb.MintCredential, len(req.Items))
	for i, r := range req.Items {
		items[i] = mintToProto(r)
	}
	err := handoff(ctx, out, gone, &pb.PluginMessage{Msg: &pb.PluginMessage_MintCredentials{MintCredentials: &pb.MintCredentials{
		RequestId: id, Items: items,
	}}})
	if err != nil {
		return nil, fmt.Errorf("asking for %d credentials: %w", len(req.Items), err)
	}
	select {
	case c := <-answer:
		if c.GetErrorCode() != 0 {
			return nil, fromStatus(status.Error(codes.Code(c.GetErrorCode()), c.GetErrorMessage()), false)
		}
		// shared.MintCredentials checks the count against what it asked.
		resp := &shared.MintCredentialsResponse{Items: make([]shared.MintCredentialResult, len(c.GetItems()))}
		for i, item := range c.GetItems() {
			resp.Items[i].Credential, resp.Items[i].Err = credentialFromProto(item)
		}
		return resp, nil
	case <-gone:
		return nil, fmt.Errorf("%w: the host went away before answering", shared.ErrNoHost)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// oneAtATime hides a link's MintCredentials, so that shared.MintCredentials
// falls back to one MintCredential an item.
type oneAtATime struct{ l *pluginLink }

func (o oneAtATime) Publish(ctx context.Context, ev shared.Event) error { return o.l.Publish(ctx, ev) }
func (o oneAtATime) MintCredential(ctx context.Context, r *shared.MintCredentialRequest) (*shared.MintCredentialResponse, error) {
	return o.l.MintCredential(ctx, r)
}

// batchRefusal says why a batch mint is refused whole, or "" if it is
// not: the guard judges each item, this only bounds the batch.
func batchRefusal(items []*pb.MintCredential) string {
	if len(items) == 0 {
		return "a batch mint names no worker"
	}
	if len(items) > shared.MaxMintBatch {
		return fmt.Sprintf("a batch mint names %d workers, more than %d: ask in batches of at most %d", len(items), shared.MaxMintBatch, shared.MaxMintBatch)
	}
	seen := make(map[string]struct{}, len(items))
	for _, it := range items {
		if _, dup := seen[it.GetWorker()]; dup {
			return fmt.Sprintf("a batch mint names worker %q twice: a credential is worth one worker", clip.Bytes(it.GetWorker(), maxEventField))
		}
		seen[it.GetWorker()] = struct{}{}
	}
	return ""
}

// hostCapabilities are what the host's end of the channel offers a
// plugin, said in its Hello.
var hostCapabilities = []shared.Capability{shared.CapabilityBatchMint}

// hostLink is the host's end of the channel: one goroutine that reads what
// the plugin sends and answers it, and one that hands its events to the
// Host, in order.
type hostLink struct {
	done chan struct{} // closed when both have returned
}

// HostChannel is what the host's end of the channel serves.
type HostChannel struct {
	// Name is the provisioner's name, sent in Hello.
	Name string
	// Contract and Capabilities are what the host says of itself in
	// Hello. An empty Contract means shared.ContractVersion with
	// hostCapabilities; a test that acts as another host sets both. The
	// host answers MintCredentials only when they offer
	// CapabilityBatchMint (shared.HasCapability), as it says.
	Contract     string
	Capabilities []shared.Capability
	// Host answers the plugin. Its Publish is called from the channel's
	// dispatcher, one event at a time and in order; its MintCredential
	// from the reader, so it must be quick (a signature, not a network
	// call).
	Host shared.Host
	// Queue bounds the events waiting for Host.Publish; zero means
	// DefaultEventQueue. QueueBytes bounds their size (eventBytes);
	// zero means DefaultEventQueueBytes.
	Queue      int
	QueueBytes int
	// OnError hears why the channel ended, unless the plugin exited.
	OnError func(error)
	// OnDrop hears of each event dropped for a full queue, with how many
	// have been dropped in all. It is called from the reader: keep it
	// quick.
	OnDrop func(ev shared.Event, dropped int64)
}

// OpenHostChannel opens the channel and starts serving it. It returns
// once the plugin has answered Hello. A plugin that does not implement
// the channel is tolerated: it simply cannot publish or mint.
func (c *Client) OpenHostChannel(ctx context.Context, hc HostChannel) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.link != nil {
		return nil
	}
	if hc.Queue <= 0 {
		hc.Queue = DefaultEventQueue
	}
	if hc.QueueBytes <= 0 {
		hc.QueueBytes = DefaultEventQueueBytes
	}
	// The stream lives as long as the plugin process, not as long as the
	// call that happened to open it.
	streamCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(c.done, cancel)
	stream, err := c.rpc.HostChannel(streamCtx)
	if err != nil {
		stop()
		cancel()
		return fromStatus(err, c.done.Err() != nil)
	}
	if hc.Contract == "" {
		hc.Contract, hc.Capabilities = shared.ContractVersion, hostCapabilities
	}
	hello := &pb.Hello{Name: hc.Name, ContractVersion: hc.Contract, Capabilities: capabilitiesToProto(hc.Capabilities)}
	if err := stream.Send(&pb.HostMessage{Msg: &pb.HostMessage_Hello{Hello: hello}}); err != nil {
		stop()
		cancel()
		return fromStatus(err, c.done.Err() != nil)
	}

	first := make(chan error, 1)
	go func() {
		msg, err := stream.Recv()
		if err == nil && msg.GetReady() == nil {
			err = errors.New("the plugin did not answer Hello with Ready")
		}
		first <- err
	}()
	timer := time.NewTimer(helloTimeout)
	defer timer.Stop()
	select {
	case err = <-first:
	case <-timer.C:
		err = fmt.Errorf("the plugin did not answer Hello within %s", helloTimeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		stop()
		cancel()
		if status.Code(err) == codes.Unimplemented {
			// Not an error: the plugin chose not to talk back.
			c.link = &hostLink{done: make(chan struct{})}
			close(c.link.done)
			return nil
		}
		return fromStatus(err, c.done.Err() != nil)
	}

	link := &hostLink{done: make(chan struct{})}
	c.link = link
	go func() {
		defer close(link.done)
		defer stop()
		defer cancel()
		err := c.serveHostChannel(stream, hc)
		if err != nil && hc.OnError != nil && c.done.Err() == nil {
			hc.OnError(err)
		}
	}()
	return nil
}

// DroppedEvents is how many of the plugin's events found the queue full.
func (c *Client) DroppedEvents() int64 { return c.dropped.Load() }

// serveHostChannel answers the plugin until the stream ends, then waits
// for the dispatcher to hand every queued event to the Host: they were
// acknowledged, so they are delivered even after the plugin is gone.
func (c *Client) serveHostChannel(stream pb.Provisioner_HostChannelClient, hc HostChannel) error {
	ctx := stream.Context()
	batch := shared.HasCapability(hc.Contract, hc.Capabilities, shared.CapabilityBatchMint)
	queue := newEventQueue(hc.Queue, hc.QueueBytes)
	dispatched := make(chan struct{})
	go func() {
		defer close(dispatched)
		// Not the stream's context: it ends with the stream, and the
		// events still queued then are owed all the same.
		dctx := context.WithoutCancel(ctx)
		for {
			ev, ok := queue.take()
			if !ok {
				return
			}
			// The event is acknowledged even when the host's handler
			// fails: the plugin cannot do better by sending it again.
			_ = hc.Host.Publish(dctx, ev)
		}
	}()
	defer func() {
		queue.close()
		<-dispatched
	}()
	for {
		msg, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
		var reply *pb.HostMessage
		switch m := msg.GetMsg().(type) {
		case *pb.PluginMessage_Event:
			// Clipped before it waits, so that the queue holds what
			// the engine will keep, not what the plugin sent.
			ev := ClipEvent(eventFromProto(m.Event))
			if ev.Time.IsZero() {
				// Stamped on arrival, not when the handler gets to it.
				ev.Time = time.Now()
			}
			if !queue.put(ev) {
				n := c.dropped.Add(1)
				if hc.OnDrop != nil {
					hc.OnDrop(ev, n)
				}
			}
			reply = &pb.HostMessage{Msg: &pb.HostMessage_EventAck{EventAck: &pb.EventAck{Seq: m.Event.GetSeq()}}}
		case *pb.PluginMessage_MintCredential:
			cred := mintOne(ctx, hc.Host, m.MintCredential)
			cred.RequestId = m.MintCredential.GetRequestId()
			reply = &pb.HostMessage{Msg: &pb.HostMessage_Credential{Credential: cred}}
		case *pb.PluginMessage_MintCredentials:
			if !batch {
				continue // as a host without batch mint does: it does not know the message
			}
			// Each item goes through the same Host.MintCredential, and so
			// the same guard, as a single mint: the batch saves round
			// trips and nothing else.
			creds := &pb.Credentials{RequestId: m.MintCredentials.GetRequestId()}
			if why := batchRefusal(m.MintCredentials.GetItems()); why != "" {
				creds.ErrorCode, creds.ErrorMessage = int32(codes.InvalidArgument), why
			} else {
				creds.Items = make([]*pb.Credential, len(m.MintCredentials.GetItems()))
				for i, it := range m.MintCredentials.GetItems() {
					creds.Items[i] = mintOne(ctx, hc.Host, it)
				}
			}
			reply = &pb.HostMessage{Msg: &pb.HostMessage_Credentials{Credentials: creds}}
		default:
			continue
		}
		if err := stream.Send(reply); err != nil {
			return err
		}
	}
}

// mintOne asks host for one credential and puts its answer, or its
// refusal, on the wire.
func mintOne(ctx context.Context, host shared.Host, m *pb.MintCredential) *pb.Credential {
	cred := &pb.Credential{}
	r, err := host.MintCredential(ctx, mintFromProto(m))
	if err != nil {
		st, _ := status.FromError(toStatus(err))
		cred.ErrorCode, cred.ErrorMessage = int32(st.Code()), st.Message()
	} else {
		cred.Token, cred.ExpiresUnixNano = r.Token, unixNano(r.Expires)
	}
	return cred
}
