package engine

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"time"

	"github.com/fluksio/provision/engine/internal/park"
)

// A waiter waits out a long poll that has nothing to answer yet, and
// answers it. Either kind arms the poll (longPoll.arm), so that the
// books wake it when they change for it, and asks the books for the
// answer (longPoll.settle) when its wait ends; neither decides anything
// itself, so a held poll and a parked one cannot answer differently.
type waiter interface {
	wait(w http.ResponseWriter, r *http.Request, lp *longPoll)
}

// waiterFor is how r waits: parked when the API parks polls and r can be
// parked (engine/internal/park), else held.
func (a *workerAPI) waiterFor(r *http.Request) waiter {
	if a.parker.CanPark(r) {
		return parkedWait{a.parker}
	}
	return heldWait{}
}

// heldWait waits on the request's goroutine, as net/http holds any request.
type heldWait struct{}

func (heldWait) wait(w http.ResponseWriter, r *http.Request, lp *longPoll) {
	woken := make(chan struct{}, 1)
	lp.arm(func() {
		select {
		case woken <- struct{}{}:
		default:
		}
	})
	timer := time.NewTimer(lp.wait)
	defer timer.Stop()
	for {
		why := wakeBooks
		select {
		case <-woken:
		case <-timer.C:
			why = wakeTimer
		case <-r.Context().Done():
		}
		if r.Context().Err() != nil {
			why = wakeHangup
		}
		ans, task := lp.settle(why)
		if ans == answerWait {
			continue
		}
		if why != wakeHangup {
			writePollAnswer(w, lp, ans, task)
		}
		return
	}
}

// parkedWait takes the connection from the server and answers it later;
// the request's goroutine returns at once. A request the parker cannot
// take is held.
type parkedWait struct{ p *park.Parker }

func (pk parkedWait) wait(w http.ResponseWriter, r *http.Request, lp *longPoll) {
	pp, ok := pk.p.Hijack(w, r, func(why park.Reason) park.Answer {
		wr := map[park.Reason]wakeReason{park.Timer: wakeTimer, park.Woken: wakeBooks, park.Hangup: wakeHangup, park.Closing: wakeDone}[why]
		ans, task := lp.settleNow(wr)
		if why == park.Hangup {
			return park.Answer{}
		}
		// As writePollAnswer: a worker detached meanwhile keeps no
		// connection, nor does a closing engine.
		status, body := pollAnswerHTTP(lp, ans, task)
		return park.Answer{Status: status, Body: body, Close: ans == answerNotAttached || isClosed(lp.books.done)}
	})
	switch {
	case !ok:
		heldWait{}.wait(w, r, lp)
	case pp == nil:
		// Taken and closed (the connection was closing): the poll ends
		// as one whose worker hung up.
		lp.settleNow(wakeHangup)
	default:
		lp.arm(pp.Wake)
		pp.Hold(lp.wait)
	}
}

// newParker returns a parker for the server whose listener is ln and
// whose connections gate accounts for, or nil where polls cannot be
// parked (they are held).
func newParker(gate *connGate, ln *park.Listener) *park.Parker {
	p, err := park.New(gate, ln, writeSlack)
	if err != nil {
		return nil
	}
	return p
}

// serverListener is what the engine's server serves on: ln, under TLS
// when tlsConfig is set, taken here rather than by ServeTLS so that a
// parked poll's connection goes back to the server already decrypting;
// HTTP/1.1 only, because a poll parks only on HTTP/1.
func serverListener(ln net.Listener, tlsConfig *tls.Config) *park.Listener {
	if tlsConfig != nil {
		cfg := tlsConfig.Clone()
		cfg.NextProtos = []string{"http/1.1"}
		ln = tls.NewListener(ln, cfg)
	}
	return park.NewListener(ln)
}

// connGate is park.Gate: a parked connection stays counted, as the
// worker's, while the server has no word of it.
var _ park.Gate = (*connGate)(nil)

// Conn is the connection ctx's request arrived on, if the gate knows it.
func (g *connGate) Conn(ctx context.Context) net.Conn {
	e, _ := ctx.Value(connEntryKey{}).(*connEntry)
	if e == nil || e.gate != g {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return e.conn
}
