package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fluksio/provision/internal/backoff"
)

// pollOpenFor is how long a worker keeps polling again while the engine
// says its previous poll is still open (409 poll_open): longer than the
// engine holds a poll (defaultPollWait), so a poll the engine still
// holds has ended by then.
const pollOpenFor = 3 * 20 * time.Second

// Client is one worker's conversation with the engine. It is used
// by one goroutine, the one that calls run.
type Client struct {
	cfg  Config
	log  *log.Logger
	http *http.Client
	name string // as the engine knows us, from the attach response
	// session is the secret the attach was answered with; work, result
	// and detach carry it (engine/session.go). Empty before the first attach.
	session string
}

// Why a request to the engine did not get an answer worth having.
var (
	errEngineGone = errors.New("engine unreachable")
	errRefused    = errors.New("engine refused the credential")
)

// NewClient returns a worker that talks to the engine cfg names through
// hc, logging to logger.
func NewClient(cfg Config, logger *log.Logger, hc *http.Client) *Client {
	return &Client{cfg: cfg, log: logger, http: hc}
}

// Session is the session secret of the last attach; empty before one.
func (w *Client) Session() string { return w.session }

// Work attaches, runs tasks until the worker has been idle for its
// MaxIdle, the engine lets it go or ctx ends, and detaches; it returns
// the exit code Main would.
func (w *Client) Work(ctx context.Context) int {
	if err := w.Attach(ctx); err != nil {
		if ctx.Err() != nil {
			// Stopped mid-attach. The engine may have heard us, so say
			// goodbye all the same.
			w.log.Printf("stopping before attached: %v", context.Cause(ctx))
			w.detach(ctx)
			return 0
		}
		w.log.Printf("could not attach to %s: %v", w.cfg.url.Redacted(), err)
		return 1
	}
	w.log.Printf("attached to %s as %s (host %s, slurm job %q, %d cpus, %d gpus)",
		w.cfg.url.Redacted(), w.name, w.cfg.hostname, w.cfg.slurmJobID, w.cfg.cpus, w.cfg.gpus)

	idleSince := time.Now()
	for {
		if ctx.Err() != nil {
			w.log.Printf("stopping: %v", context.Cause(ctx))
			w.detach(ctx)
			return 0
		}
		left := w.cfg.maxIdle - time.Since(idleSince)
		if left <= 0 {
			w.log.Printf("no work for %s; leaving", w.cfg.maxIdle)
			w.detach(ctx)
			return 0
		}
		task, err := w.Poll(ctx, left)
		switch {
		case errors.Is(err, errLeave):
			// The engine is stopping cleanly: our job ends now, completed.
			w.log.Printf("the engine lets us go; leaving")
			w.detach(ctx)
			return 0
		case errors.Is(err, errNotAttachedRemote):
			// The engine restarted or gave up on us; say hello again.
			w.log.Printf("engine does not know us; attaching again")
			if err := w.Attach(ctx); err != nil && ctx.Err() == nil {
				w.log.Printf("could not attach again: %v", err)
				return 1
			}
			continue // if ctx ended, the top of the loop detaches
		case ctx.Err() != nil:
			continue // the top of the loop detaches
		case err != nil:
			w.log.Printf("giving up: %v", err)
			return 1
		case task == nil:
			continue
		}

		w.log.Printf("running %s", task.ID)
		taskCtx, dropTask := context.WithCancel(ctx)
		stopWatch := w.watch(taskCtx, dropTask)
		res := w.work(taskCtx, *task)
		dismissed := stopWatch()
		dropTask()
		if dismissed {
			// The engine is stopping cleanly and has no use for the
			// result: our job ends now, completed, not after the task.
			w.log.Printf("the engine lets us go; dropping %s and leaving", task.ID)
			w.detach(ctx)
			return 0
		}
		if err := w.report(ctx, res); err != nil {
			if ctx.Err() != nil {
				continue
			}
			w.log.Printf("could not report %s: %v", task.ID, err)
			if errors.Is(err, errEngineGone) || errors.Is(err, errRefused) {
				return 1
			}
		} else {
			w.log.Printf("reported %s", task.ID)
		}
		idleSince = time.Now()
	}
}

// errNotAttachedRemote is the engine's 409: it does not know this worker.
var errNotAttachedRemote = errors.New("engine does not know this worker")

// errLeave is the engine's 410 with CodeLeave: it is stopping cleanly.
var errLeave = errors.New("the engine lets its workers go")

// Attach attaches to the engine (again, after a 409), and keeps the
// session it answers with.
func (w *Client) Attach(ctx context.Context) error {
	req := AttachRequest{
		Hostname: w.cfg.hostname, JobID: w.cfg.slurmJobID,
		CPUs: w.cfg.cpus, GPUs: w.cfg.gpus, RAMMB: w.cfg.ramMB, Labels: w.cfg.labels,
	}
	var resp AttachResponse
	if _, err := w.call(ctx, http.MethodPost, "/v1/attach", nil, req, &resp, 0); err != nil {
		return err
	}
	if resp.Session == "" {
		return errors.New("POST /v1/attach: the engine answered without a session; it is older than this worker")
	}
	w.name, w.session = resp.Worker, resp.Session
	return nil
}

// Poll long-polls for a task, asking the engine to wait no longer than
// the time left before we would leave anyway.
func (w *Client) Poll(ctx context.Context, left time.Duration) (*Task, error) {
	q := url.Values{"wait": {strconv.FormatFloat(left.Seconds(), 'f', 3, 64)}}
	var t Task
	// The engine answers within left (or its own shorter PollWait); the
	// extra is for the network, not for the engine to use.
	status, err := w.call(ctx, http.MethodGet, "/v1/work", q, nil, &t, left+30*time.Second)
	if err != nil || status == http.StatusNoContent {
		return nil, err
	}
	return &t, nil
}

// watchTimeout bounds one GET /v1/watch: the engine answers within its
// poll wait (20 s unless an embedder changed it); the rest is slack.
const watchTimeout = 90 * time.Second

// watch keeps GET /v1/watch open while a task runs, so that an engine
// stopping cleanly can let this worker go in the middle of its task
// (Books.handleWatch). On the engine's word to leave it calls drop, which
// ends the task. The stop it returns ends the watch, waits for its
// goroutine, and says whether the engine said to leave. An engine that
// does not answer the watch (it is older than it, or has gone away, which
// the report will find) is not watched further; the task goes on.
func (w *Client) watch(ctx context.Context, drop context.CancelFunc) (stop func() bool) {
	ctx, cancel := context.WithCancel(ctx)
	var left atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			status, err := w.call(ctx, http.MethodGet, "/v1/watch", nil, nil, nil, watchTimeout)
			switch {
			case errors.Is(err, errLeave):
				left.Store(true)
				drop()
				return
			case err == nil && status == http.StatusNoContent:
			default:
				return
			}
		}
	}()
	return func() bool {
		cancel()
		<-done
		return left.Load()
	}
}

// work runs a task. The work itself is a stand-in: say where it ran and
// with how much, and prove it ran by computing something. A task with
// WorkSeconds sleeps that long instead, and says so: it stands for work
// that takes time, so that a burst's parallelism shows, without loading
// a machine the sandbox shares with every other worker.
func (w *Client) work(ctx context.Context, t Task) ResultRequest {
	cpus := w.cfg.cpus
	if n, err := strconv.Atoi(w.cfg.slurmCPUs); err == nil && n > 0 {
		cpus = n
	}
	res := ResultRequest{TaskID: t.ID, Hostname: w.cfg.hostname, JobID: w.cfg.slurmJobID, CPUs: cpus}
	if t.WorkSeconds > 0 {
		d := time.Duration(min(t.WorkSeconds, 24*3600) * float64(time.Second))
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
			res.Output = fmt.Sprintf("slept %s (simulated work) on %s with %d cpus", d, w.cfg.hostname, cpus)
		case <-ctx.Done():
			res.Output = fmt.Sprintf("interrupted after part of %s of simulated work on %s", d, w.cfg.hostname)
		}
		return res
	}
	const below = 100000
	res.Output = fmt.Sprintf("%d primes below %d on %s with %d cpus", countPrimes(below), below, w.cfg.hostname, cpus)
	return res
}

func (w *Client) report(ctx context.Context, res ResultRequest) error {
	status, err := w.call(ctx, http.MethodPost, "/v1/result", nil, res, nil, 0)
	if err == nil && status == http.StatusConflict {
		// Already recorded (our retry after a lost response) or taken
		// back; either way there is nothing more to say about it.
		return nil
	}
	return err
}

// detach tells the engine we are leaving. It is a courtesy: an engine
// that does not hear it notices our silence soon enough, so it is tried
// once, briefly, even when ctx is already cancelled.
func (w *Client) detach(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	req, err := w.newRequest(ctx, http.MethodPost, "/v1/detach", nil, nil)
	if err != nil {
		return
	}
	resp, err := w.http.Do(req)
	if err != nil {
		w.log.Printf("could not detach: %v", err)
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	w.log.Printf("detached")
}

// call makes one request to the engine, retrying while the engine is
// unreachable or says it is unavailable, for up to cfg.GoneAfter since the
// first failure, with doubling pauses. It returns the status for 2xx and
// 409 (and decodes a 200 body into out); 401 is errRefused; anything
// else is an error with the engine's message. timeout bounds each attempt
// (0: 30 s).
func (w *Client) call(ctx context.Context, method, path string, q url.Values, body, out any, timeout time.Duration) (int, error) {
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return 0, err
		}
	}
	var firstFailure, openSince time.Time
	pause := w.cfg.RetryFirst
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	for {
		status, answer, err := w.once(ctx, method, path, q, payload, out, timeout)
		msg := answer.Error
		switch {
		case ctx.Err() != nil:
			return 0, ctx.Err()
		case err == nil && status == http.StatusConflict && answer.Code == CodePollOpen:
			// Our previous poll is still open on the engine's side (its
			// answer was lost, or we gave up on it first): it ends
			// within the engine's poll wait, so wait, and poll again.
			if openSince.IsZero() {
				openSince = time.Now()
			}
			if time.Since(openSince) >= pollOpenFor {
				return status, fmt.Errorf("%s %s: %s, for %s", method, path, msg, pollOpenFor)
			}
			if !wait(pause) {
				return 0, ctx.Err()
			}
			pause = backoff.Next(pause, 2*time.Second)
			continue
		case err == nil && status == http.StatusGone && answer.Code == CodeLeave:
			return status, errLeave
		case err == nil && status == http.StatusConflict && path != "/v1/attach":
			if path == "/v1/work" {
				return status, errNotAttachedRemote
			}
			return status, nil
		case err != nil && engineUnverified(err):
			// A certificate that does not verify will not verify on the
			// next try either: say so now, not after GoneAfter.
			return 0, err
		case err == nil && status == http.StatusUnauthorized:
			return status, fmt.Errorf("%w: %s", errRefused, msg)
		case err == nil && status >= 200 && status < 300:
			return status, nil
		case err == nil && status != http.StatusServiceUnavailable && status != http.StatusBadGateway && status != http.StatusGatewayTimeout:
			return status, fmt.Errorf("%s %s: %d %s", method, path, status, msg)
		}
		// Unreachable, or there but not taking requests: wait a little.
		if err == nil {
			err = fmt.Errorf("%d %s", status, msg)
		}
		if firstFailure.IsZero() {
			firstFailure = time.Now()
		}
		if time.Since(firstFailure) >= w.cfg.GoneAfter {
			return 0, fmt.Errorf("%w for %s: %v", errEngineGone, w.cfg.GoneAfter, err)
		}
		w.log.Printf("%s %s failed, retrying in %s: %v", method, path, pause, err)
		if !wait(pause) {
			return 0, ctx.Err()
		}
		pause = backoff.Next(pause, 2*time.Second)
	}
}

// once makes one attempt. err is set only when no response came back.
func (w *Client) once(ctx context.Context, method, path string, q url.Values, payload []byte, out any, timeout time.Duration) (status int, answer ErrorResponse, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := w.newRequest(ctx, method, path, q, payload)
	if err != nil {
		return 0, answer, err
	}
	resp, err := w.http.Do(req)
	if err != nil {
		return 0, answer, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxResultBody))
	if err != nil {
		return 0, answer, err
	}
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return 0, answer, fmt.Errorf("%s %s: bad response: %w", method, path, err)
		}
	}
	if resp.StatusCode != http.StatusOK {
		_ = json.Unmarshal(data, &answer)
	}
	return resp.StatusCode, answer, nil
}

func (w *Client) newRequest(ctx context.Context, method, path string, q url.Values, payload []byte) (*http.Request, error) {
	u := *w.cfg.url
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = q.Encode()
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+w.cfg.token)
	if w.session != "" && path != "/v1/attach" {
		req.Header.Set(SessionHeader, w.session)
	}
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// countPrimes counts the primes below n with a sieve: small, exact, and
// easy to check (9592 below 100000).
func countPrimes(n int) int {
	if n < 3 {
		return 0
	}
	composite := make([]bool, n)
	count := 0
	for i := 2; i < n; i++ {
		if composite[i] {
			continue
		}
		count++
		for j := i * i; j < n; j += i {
			composite[j] = true
		}
	}
	return count
}

// JobID is the job a worker runs as, the way its provisioner recorded it
// and the attach's job_id must name it: <array job>_<task> for a Slurm
// array task (a burst's machine), else SLURM_JOB_ID.
func JobID(getenv func(string) string) string {
	if job, task := getenv("SLURM_ARRAY_JOB_ID"), getenv("SLURM_ARRAY_TASK_ID"); job != "" && task != "" {
		return job + "_" + task
	}
	return getenv("SLURM_JOB_ID")
}
