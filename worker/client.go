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
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fluksio/provision/internal/backoff"
)

// pollOpenFor is how long a worker keeps polling again while the engine
// says its previous poll is still open (409 poll_open): longer than the
// engine holds a poll (defaultPollWait), so a poll the engine still
// holds has ended by then.
const pollOpenFor = 3 * 20 * time.Second

// Client is one worker's conversation with the engine. Work runs it on
// the goroutine that calls it; while a task runs, the task's own
// goroutines (its watch, its command's streams) make requests too, and
// read name and session, which only Attach writes, between tasks.
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
	w.log.Printf("attached to %s as %s (host %s, slurm job %q, %d cpus, %d gpus, %d MB)",
		w.cfg.url.Redacted(), w.name, w.cfg.hostname, w.cfg.slurmJobID, w.cfg.cpus, w.cfg.gpus, w.cfg.ramMB)
	for _, n := range w.cfg.sizeNotes {
		w.log.Printf("%s", n)
	}
	if slices.Contains(w.cfg.features, FeatureSlots) {
		return w.workSlots(ctx)
	}

	idleSince := time.Now()
	// next is the task the last result's answer carried, run without
	// polling.
	var next *Task
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
		if !w.cfg.endsAt.IsZero() {
			// Leave before the job's end, so that it ends COMPLETED and
			// not killed with a task.
			toEnd := time.Until(w.cfg.endsAt) - EndMargin
			if toEnd <= 0 {
				w.log.Printf("the job ends at %s; leaving %s before it", w.cfg.endsAt.UTC().Format(time.RFC3339), EndMargin)
				w.detach(ctx)
				return 0
			}
			left = min(left, toEnd)
		}
		task, err := next, error(nil)
		next = nil
		if task == nil {
			task, err = w.Poll(ctx, left)
		}
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

		code, leave, carried := w.take(ctx, *task)
		if leave {
			return code
		}
		next = carried
		idleSince = time.Now()
	}
}

// resultWait is how long a result's answer may wait for the next task
// (POST /v1/result?wait=SECONDS): the engine holds it for a second at
// most, as it does whatever this says, and a worker with no task then
// polls. Zero when the worker is about to leave: its job's end is near.
func (w *Client) resultWait() time.Duration {
	left := w.cfg.maxIdle
	if !w.cfg.endsAt.IsZero() {
		left = min(left, time.Until(w.cfg.endsAt)-EndMargin)
	}
	return max(left, 0)
}

// take runs task and reports it, and returns the next task if the
// result's answer carried one. leave says the worker is done, with code
// its exit code: the engine let it go or it was told to stop (the task
// dropped unreported, its command's group already killed, the worker
// detached), or the engine is gone or refuses it.
func (w *Client) take(ctx context.Context, task Task) (code int, leave bool, next *Task) {
	w.log.Printf("running %s", task.label())
	st := newStopper(ctx)
	stopWatch := w.watch(ctx, task.ID, st)
	res, dir := w.runTask(ctx, task, st)
	stopWatch()
	reason, why := st.why()
	st.release()
	if reason.dropsTask() {
		// The engine is stopping cleanly and has no use for the result,
		// or this worker is stopping (SIGTERM): our job ends now,
		// completed.
		w.removeTaskDir(dir)
		if reason == stopLeave {
			w.log.Printf("the engine lets us go; dropping %s and leaving", task.label())
		} else {
			w.log.Printf("%s; dropped %s", why, task.label())
		}
		w.detach(ctx)
		return 0, true, nil
	}
	next, err := w.reportAndPoll(ctx, res, w.resultWait())
	// Reported, or never will be: the directory has nothing more to give.
	w.removeTaskDir(dir)
	switch {
	case err == nil:
		w.log.Printf("reported %s: %s", task.label(), describe(res))
	case errors.Is(err, errLeave):
		// Recorded, and the engine is stopping cleanly.
		w.log.Printf("reported %s: %s; the engine lets us go; leaving", task.label(), describe(res))
		w.detach(ctx)
		return 0, true, nil
	case ctx.Err() != nil:
	default:
		w.log.Printf("could not report %s: %v", task.label(), err)
		if errors.Is(err, errEngineGone) || errors.Is(err, errRefused) {
			return 1, true, nil
		}
	}
	return 0, false, next
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
		Features: w.cfg.features,
	}
	if !w.cfg.endsAt.IsZero() {
		req.EndsAt = w.cfg.endsAt.Unix()
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
	return w.poll(ctx, left, nil)
}

// poll is Poll; running, when not nil, names the tasks a worker with
// slots runs (RunningParam), none when empty.
func (w *Client) poll(ctx context.Context, left time.Duration, running []string) (*Task, error) {
	q := url.Values{"wait": {strconv.FormatFloat(left.Seconds(), 'f', 3, 64)}}
	if running != nil {
		q.Set(RunningParam, strings.Join(running, ","))
	}
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

// watch keeps GET /v1/watch open while task id runs, from cfg.WatchAfter
// into it on, so that the engine can cancel it (200, WatchAnswer.Cancel
// naming it) and, when it stops cleanly, let this worker go in the
// middle of it (410 leave; the engine's workerAPI.handleWatch). Either stops the task
// through st. The stop it returns ends the watch and waits for its
// goroutine. A watch answered anything else (an engine older than the
// watch, or one gone away, which the report will find) is not opened
// again; the task goes on.
func (w *Client) watch(ctx context.Context, id string, st *stopper) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if w.cfg.WatchAfter > 0 {
			t := time.NewTimer(w.cfg.WatchAfter)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		for ctx.Err() == nil {
			var ans WatchAnswer
			status, err := w.call(ctx, http.MethodGet, "/v1/watch", nil, nil, &ans, watchTimeout)
			switch {
			case errors.Is(err, errLeave):
				st.stop(stopLeave, "the engine lets its workers go")
				return
			case err == nil && status == http.StatusOK && ans.Cancel == id:
				why := "cancelled by the engine"
				if ans.Reason != "" {
					why += ": " + ans.Reason
				}
				st.stop(stopCancel, why)
				return
			case err == nil && (status == http.StatusNoContent || status == http.StatusOK):
				// Nothing yet, or the cancel of a task this worker has
				// already reported: watch on.
			default:
				return
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// reportAndPoll reports res and, with wait, asks that the answer be the
// next poll's too (POST /v1/result?wait=SECONDS): a task when the
// engine has one within wait (a second at most), else none, and the
// worker polls. An engine older than that answers 204 to it, as to any
// result.
func (w *Client) reportAndPoll(ctx context.Context, res ResultRequest, wait time.Duration) (*Task, error) {
	var q url.Values
	if wait > 0 {
		q = url.Values{"wait": {strconv.FormatFloat(wait.Seconds(), 'f', 3, 64)}}
	}
	var t Task
	status, err := w.call(ctx, http.MethodPost, "/v1/result", q, res, &t, 0)
	switch {
	case err != nil:
		return nil, err
	case status == http.StatusOK:
		return &t, nil
	}
	// 204, or 409: already recorded (our retry after a lost response)
	// or taken back; either way there is nothing more to say about it.
	return nil, nil
}

// detach tells the engine we are leaving. It is a courtesy: an engine
// that does not hear it notices our silence soon enough, so it is tried
// once, briefly, even when ctx is already cancelled.
func (w *Client) detach(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	req, err := w.newRequest(ctx, http.MethodPost, "/v1/detach", nil, nil, "")
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
	var openSince time.Time
	r := w.retrying()
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
			if err := r.pauseFor(ctx); err != nil {
				return 0, err
			}
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
		case err == nil && !unavailable(status):
			return status, fmt.Errorf("%s %s: %d %s", method, path, status, msg)
		}
		// Unreachable, or there but not taking requests: wait a little.
		if err == nil {
			err = fmt.Errorf("%d %s", status, msg)
		}
		if err := r.again(ctx, method, path, err); err != nil {
			return 0, err
		}
	}
}

// unavailable reports whether status says the engine (or a proxy in
// front of it) is there but not taking requests now, which a retry may
// get past.
func unavailable(status int) bool {
	return status == http.StatusServiceUnavailable || status == http.StatusBadGateway || status == http.StatusGatewayTimeout
}

// retry is the pause between one request's tries while the engine is
// unreachable or unavailable, and since when that has lasted.
type retry struct {
	w            *Client
	firstFailure time.Time
	pause        time.Duration
}

func (w *Client) retrying() *retry { return &retry{w: w, pause: w.cfg.RetryFirst} }

// again pauses before the next try after err, which was the engine
// unreachable or unavailable; it returns errEngineGone once that has
// lasted cfg.GoneAfter, or ctx's error if ctx ends first.
func (r *retry) again(ctx context.Context, method, path string, err error) error {
	if r.firstFailure.IsZero() {
		r.firstFailure = time.Now()
	}
	if time.Since(r.firstFailure) >= r.w.cfg.GoneAfter {
		return fmt.Errorf("%w for %s: %v", errEngineGone, r.w.cfg.GoneAfter, err)
	}
	r.w.log.Printf("%s %s failed, retrying in %s: %v", method, path, r.pause, err)
	return r.pauseFor(ctx)
}

// pauseFor waits the current pause, doubling the next (to 2 s at most);
// it returns ctx's error if ctx ends first.
func (r *retry) pauseFor(ctx context.Context) error {
	t := time.NewTimer(r.pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	r.pause = backoff.Next(r.pause, 2*time.Second)
	return nil
}

// once makes one attempt. err is set only when no response came back.
func (w *Client) once(ctx context.Context, method, path string, q url.Values, payload []byte, out any, timeout time.Duration) (status int, answer ErrorResponse, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var body io.Reader
	contentType := ""
	if payload != nil {
		body, contentType = bytes.NewReader(payload), "application/json"
	}
	req, err := w.newRequest(ctx, method, path, q, body, contentType)
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

// newRequest is a request to the engine with the worker's credential
// and session. path is escaped already (the transfers' paths hold
// escaped names) and goes after the engine URL's own path; body, when
// not nil, is sent as contentType.
func (w *Client) newRequest(ctx context.Context, method, path string, q url.Values, body io.Reader, contentType string) (*http.Request, error) {
	u := *w.cfg.url
	raw := strings.TrimSuffix(u.EscapedPath(), "/") + path
	decoded, err := url.PathUnescape(raw)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	u.Path, u.RawPath = decoded, raw
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+w.cfg.token)
	if w.session != "" && path != "/v1/attach" {
		req.Header.Set(SessionHeader, w.session)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return req, nil
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
