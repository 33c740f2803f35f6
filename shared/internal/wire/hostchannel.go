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

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/internal/pb"
)

// The host channel is the plugin's way back to the engine: one
// bidirectional stream that the host opens, over which the plugin sends
// events and credential requests and the host answers each. It is plain
// gRPC, so a plugin in any language can implement it; go-plugin's broker
// would have done the same for Go only, at the cost of a second listener
// and a five-second dial timeout nobody outside Go can see.

// helloTimeout bounds how long the host waits for a plugin to answer
// Hello. A plugin that takes longer is broken, not busy.
const helloTimeout = 10 * time.Second

// pluginLink is the plugin's end of the host channel and the Host that the
// SDK hands to the implementation. It survives the stream: before the
// host connects, and after it disconnects, calls fail with ErrNoHost.
type pluginLink struct {
	// sendMu serialises Send on the stream, which gRPC requires, and keeps
	// event numbers in the order the events go out. It is held across a
	// Send, which is a local buffer write, never across a wait for the
	// host's answer.
	sendMu sync.Mutex

	mu      sync.Mutex // guards everything below
	stream  pb.Provisioner_HostChannelServer
	gone    chan struct{} // closed when the current stream ends
	seq     uint64
	nextID  uint64
	acks    map[uint64]chan struct{}
	credits map[uint64]chan *pb.Credential
}

var _ shared.Host = (*pluginLink)(nil)

func newPluginLink() *pluginLink {
	return &pluginLink{acks: map[uint64]chan struct{}{}, credits: map[uint64]chan *pb.Credential{}}
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
	gone := s.link.attach(stream)
	defer s.link.detach(stream, gone)
	if err := s.link.send(&pb.PluginMessage{Msg: &pb.PluginMessage_Ready{Ready: &pb.Ready{}}}); err != nil {
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
		}
	}
}

func (l *pluginLink) attach(stream pb.Provisioner_HostChannelServer) chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stream = stream
	l.gone = make(chan struct{})
	return l.gone
}

// detach forgets a stream that ended. Callers still waiting on it see the
// gone channel close and fail with ErrNoHost.
func (l *pluginLink) detach(stream pb.Provisioner_HostChannelServer, gone chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stream == stream {
		l.stream = nil
	}
	close(gone)
}

func (l *pluginLink) send(msg *pb.PluginMessage) error {
	l.mu.Lock()
	stream := l.stream
	l.mu.Unlock()
	if stream == nil {
		return shared.ErrNoHost
	}
	return stream.Send(msg)
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

// Publish sends an event and waits for the host to acknowledge it, so a
// plugin that returns from Publish knows the engine has it.
func (l *pluginLink) Publish(ctx context.Context, ev shared.Event) error {
	l.sendMu.Lock()
	l.mu.Lock()
	if l.stream == nil {
		l.mu.Unlock()
		l.sendMu.Unlock()
		return fmt.Errorf("%w: cannot publish %s", shared.ErrNoHost, ev.Kind)
	}
	l.seq++
	ev.Seq = l.seq
	acked := make(chan struct{})
	l.acks[ev.Seq] = acked
	stream, gone := l.stream, l.gone
	l.mu.Unlock()
	err := stream.Send(&pb.PluginMessage{Msg: &pb.PluginMessage_Event{Event: eventToProto(ev)}})
	l.sendMu.Unlock()
	if err != nil {
		l.forgetAck(ev.Seq)
		return fmt.Errorf("%w: %v", shared.ErrNoHost, err)
	}
	select {
	case <-acked:
		return nil
	case <-gone:
		l.forgetAck(ev.Seq)
		return fmt.Errorf("%w: the host went away before acknowledging %s", shared.ErrNoHost, ev.Kind)
	case <-ctx.Done():
		l.forgetAck(ev.Seq)
		return ctx.Err()
	}
}

func (l *pluginLink) forgetAck(seq uint64) {
	l.mu.Lock()
	delete(l.acks, seq)
	l.mu.Unlock()
}

// MintCredential asks the host to sign a credential and waits for it.
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
	gone := l.gone
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.credits, id)
		l.mu.Unlock()
	}()

	l.sendMu.Lock()
	err := l.send(&pb.PluginMessage{Msg: &pb.PluginMessage_MintCredential{MintCredential: &pb.MintCredential{
		RequestId: id, Worker: req.Worker, TtlSeconds: req.TTL.Seconds(),
		Cpus: int32(req.CPUs), Gpus: int32(req.GPUs), RamMb: req.RAMMB, Labels: req.Labels,
	}}})
	l.sendMu.Unlock()
	if err != nil {
		return nil, err
	}
	select {
	case c := <-answer:
		if c.GetErrorCode() != 0 {
			return nil, fromStatus(status.Error(codes.Code(c.GetErrorCode()), c.GetErrorMessage()), false)
		}
		return &shared.MintCredentialResponse{Token: c.GetToken(), Expires: fromUnixNano(c.GetExpiresUnixNano())}, nil
	case <-gone:
		return nil, fmt.Errorf("%w: the host went away before answering", shared.ErrNoHost)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// hostLink is the host's end of the channel: one goroutine that reads what
// the plugin sends and answers it through a Host, in order.
type hostLink struct {
	done chan struct{} // closed when the serving goroutine returns
}

// OpenHostChannel opens the channel and starts serving it with h. It
// returns once the plugin has answered Hello. A plugin that does not
// implement the channel is tolerated: it simply cannot publish or mint.
func (c *Client) OpenHostChannel(ctx context.Context, name string, h shared.Host, onError func(error)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.link != nil {
		return nil
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
	if err := stream.Send(&pb.HostMessage{Msg: &pb.HostMessage_Hello{Hello: &pb.Hello{Name: name}}}); err != nil {
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
		err := serveHostChannel(stream, h)
		if err != nil && onError != nil && c.done.Err() == nil {
			onError(err)
		}
	}()
	return nil
}

// serveHostChannel answers the plugin until the stream ends. Events are
// handed to the Host one at a time, in the order the plugin sent them.
func serveHostChannel(stream pb.Provisioner_HostChannelClient, h shared.Host) error {
	ctx := stream.Context()
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
			// The event is acknowledged even when the host's handler fails:
			// the plugin cannot do better by sending it again.
			_ = h.Publish(ctx, eventFromProto(m.Event))
			reply = &pb.HostMessage{Msg: &pb.HostMessage_EventAck{EventAck: &pb.EventAck{Seq: m.Event.GetSeq()}}}
		case *pb.PluginMessage_MintCredential:
			cred := &pb.Credential{RequestId: m.MintCredential.GetRequestId()}
			r, err := h.MintCredential(ctx, &shared.MintCredentialRequest{
				Worker: m.MintCredential.GetWorker(),
				TTL:    secondsToDuration(m.MintCredential.GetTtlSeconds()),
				CPUs:   int(m.MintCredential.GetCpus()),
				GPUs:   int(m.MintCredential.GetGpus()),
				RAMMB:  m.MintCredential.GetRamMb(),
				Labels: m.MintCredential.GetLabels(),
			})
			if err != nil {
				st, _ := status.FromError(toStatus(err))
				cred.ErrorCode, cred.ErrorMessage = int32(st.Code()), st.Message()
			} else {
				cred.Token, cred.ExpiresUnixNano = r.Token, unixNano(r.Expires)
			}
			reply = &pb.HostMessage{Msg: &pb.HostMessage_Credential{Credential: cred}}
		default:
			continue
		}
		if err := stream.Send(reply); err != nil {
			return err
		}
	}
}
