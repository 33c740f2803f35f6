package slurm

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
	relayd "github.com/fluksio/provision/slurm/relay"
	"github.com/fluksio/provision/slurm/sbatch"
)

// memQueue is an in-memory queue (slurmQueue) for the decisions' tests:
// what Slurm holds is a list of jobs, and each command acts on it. A
// command a test does not set up panics, on the embedded nil interface:
// the decision under test asked for something unexpected. The queue
// itself is tested against the sandbox's real Slurm
// (slurm/internal/queue/sandbox_test.go).
type memQueue struct {
	slurmQueue

	mu sync.Mutex // guards the fields below
	// jobs are the queue's jobs, as squeue would list them.
	jobs []queue.Job
	// cancelErr fails every scancel while set; cancelled records each
	// scancel's ids.
	cancelErr error
	cancelled [][]string
	// facts and factsErr are what scontrol show config says.
	facts    queue.Facts
	factsErr error
	// all is how many jobs and array tasks slurmctld holds, every
	// user's; counted records each count.
	all     int
	counted int
}

func (m *memQueue) CountAll(context.Context) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.counted++
	return m.all, nil
}

func (m *memQueue) Jobs(context.Context, bool) ([]queue.Job, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.jobs), nil
}

func (m *memQueue) Cancel(_ context.Context, ids []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cancelled = append(m.cancelled, slices.Clone(ids))
	if m.cancelErr != nil {
		return m.cancelErr
	}
	m.jobs = slices.DeleteFunc(m.jobs, func(j queue.Job) bool { return slices.Contains(ids, j.ID) })
	return nil
}

func (m *memQueue) Facts(context.Context) (queue.Facts, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.facts, m.factsErr
}

func (m *memQueue) WaitingTurn(error) bool { return false }

func (m *memQueue) Close(context.Context) {}

// memProvisioner is a Provisioner configured with the base
// configuration whose queue is q: nothing runs, no goroutine starts.
func memProvisioner(t *testing.T, q slurmQueue) (*Provisioner, *settings) {
	t.Helper()
	s, diags := parseConfig("hpc", mustJSON(t, baseConfig()))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if err := s.identity("prod", "4f3c2b1a"); err != nil {
		t.Fatal(err)
	}
	s.log = hclog.NewNullLogger()
	p := New(nil)
	p.cfg, p.q = s, q
	return p, s
}

// TestCancellerKeepsJobsUntilSlurmAgrees, against an in-memory queue: a
// job whose scancel fails stays being cancelled, and the engine hears
// at once that its worker failed; the next try that Slurm agrees to
// settles it, and the engine hears it cancelled. Nothing is forgotten
// in between.
func TestCancellerKeepsJobsUntilSlurmAgrees(t *testing.T) {
	q := &memQueue{jobs: []queue.Job{{ID: "7", State: "PENDING"}}, cancelErr: errors.New("Unable to contact slurm controller")}
	p, cfg := memProvisioner(t, q)
	host := newFakeHost()
	ctx := context.Background()

	done := p.cancels.cancelJobs(ctx, cfg, host, []jobRef{{job: "7", profile: "cpu", worker: "hpc-cpu-0123abcd", why: "demand fell"}}, "cancelled a job")
	p.mu.Lock()
	_, kept := p.cancels.cancelling["7"]
	lastErr := p.lastErr
	p.mu.Unlock()
	if len(done) != 0 || !kept || !strings.Contains(lastErr, "Unable to contact") {
		t.Fatalf("a failed scancel: done %v, kept %v, last error %q; want the job kept and the error said", done, kept, lastErr)
	}
	if evs := host.Events(); len(evs) != 1 || evs[0].Kind != shared.EventWorkerProvisionFailed || evs[0].Job != "7" {
		t.Fatalf("events after a failed scancel: %+v; want worker_provision_failed for job 7", evs)
	}

	q.mu.Lock()
	q.cancelErr = nil
	q.mu.Unlock()
	if done := p.cancels.retryCancels(ctx, cfg, host, nil, nil); !slices.Equal(done, []string{"7"}) {
		t.Fatalf("the retry cancelled %v; want job 7", done)
	}
	p.mu.Lock()
	left := len(p.cancels.cancelling)
	p.mu.Unlock()
	evs := host.Events()
	if left != 0 || len(evs) != 2 || evs[1].Kind != shared.EventWorkerCancelled || len(q.jobs) != 0 || len(q.cancelled) != 2 {
		t.Errorf("after the retry: %d still cancelling, events %+v, queue %+v, scancels %v; want none left, worker_cancelled, an empty queue, 2 scancels",
			left, evs, q.jobs, q.cancelled)
	}
}

// TestClusterFactsFromTheQueue, against an in-memory queue: until
// scontrol show config answers, the facts are unread, Status says why,
// and a submission asks for at most unknownFactsBurst machines; once it
// answers with a MaxArraySize of 1, arrays are off (a serial batch, a
// note) and MaxJobCount and the cluster's name are the cluster's.
func TestClusterFactsFromTheQueue(t *testing.T) {
	q := &memQueue{factsErr: &queue.CommandError{Stderr: []byte("slurm_load_ctl_conf error: Unable to contact slurm controller"), Err: errors.New("exit status 1")}}
	p, _ := memProvisioner(t, q)
	ctx := context.Background()

	if err := p.known.readFacts(ctx); err == nil {
		t.Fatal("facts read from a controller that did not answer")
	}
	p.mu.Lock()
	note, capUnread := p.known.factsNoteLocked(), p.known.batchCap()
	p.mu.Unlock()
	if !strings.Contains(note, "Unable to contact slurm controller") || capUnread != unknownFactsBurst {
		t.Errorf("facts unread: note %q, batch cap %d; want the controller's words and %d", note, capUnread, unknownFactsBurst)
	}

	q.mu.Lock()
	q.facts, q.factsErr = queue.Facts{Cluster: "c1", MaxArraySize: 1, MaxJobCount: 500}, nil
	q.mu.Unlock()
	if err := p.known.readFacts(ctx); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	k := p.known
	if k.factsNoteLocked() != "" || k.batchCap() != maxSerialBatch || k.maxJobs != 500 || k.cluster != "c1" || !strings.Contains(k.arrayNote, "allows no job arrays") {
		t.Errorf("facts read: note %q, batch cap %d, maxJobs %d, cluster %q, array note %q; want none, %d, 500, c1 and arrays off",
			k.factsNoteLocked(), k.batchCap(), k.maxJobs, k.cluster, k.arrayNote, maxSerialBatch)
	}
}

// TestLimiterTrimsToMaxJobCount, against an in-memory queue: a burst the
// books bring within half of MaxJobCount counts the controller's jobs
// first, asks for the allocations that fit under the ceiling, takes the
// rest out of the books and holds the profile; far from the ceiling it
// asks for all without counting.
func TestLimiterTrimsToMaxJobCount(t *testing.T) {
	q := &memQueue{all: 7}
	p, cfg := memProvisioner(t, q)
	prof := cfg.Profiles[0]
	ctx := context.Background()
	burst := func() []*request {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.reserveLocked(cfg, prof, 3*max(1, prof.Nodes), p.now())
	}

	p.mu.Lock()
	p.known.maxJobs = 1000
	p.mu.Unlock()
	if live := burst(); len(p.lim.trimToJobCount(ctx, cfg, live)) != len(live) || q.counted != 0 {
		t.Fatalf("far from the ceiling: trimmed, or counted %d times", q.counted)
	}

	p.mu.Lock()
	p.known.maxJobs = 10 // the 3 outstanding of the first burst and 3 more are past half
	p.mu.Unlock()
	live := burst()
	kept := p.lim.trimToJobCount(ctx, cfg, live)
	p.mu.Lock()
	defer p.mu.Unlock()
	// 10 - 1 - 7 jobs leave room for 2 allocations.
	if q.counted != 1 || len(kept) != 2*max(1, prof.Nodes) || !p.holds.clusterFull.on(p.now()) {
		t.Errorf("near the ceiling: counted %d times, kept %d of %d machines, held %v; want 1 count, 2 allocations kept, the profile held",
			q.counted, len(kept), len(live), p.holds.clusterFull.on(p.now()))
	}
	for _, r := range live[len(kept):] {
		if p.outstanding[r.worker] == r {
			t.Errorf("machine %s left outside the submission is still in the books", r.worker)
		}
	}
}

// TestShutdownSweepsWhatItNeverLooked, against an in-memory queue: a
// provisioner shut down before its first look at the queue cancels every
// job of this engine it finds there, pending or running, as adoption
// would have, tells the engine of each, and leaves another engine's job
// alone.
func TestShutdownSweepsWhatItNeverLooked(t *testing.T) {
	q := &memQueue{}
	p, cfg := memProvisioner(t, q)
	host := newFakeHost()
	prof := cfg.Profiles[0].Name
	ours := func(id, state string) queue.Job {
		return queue.Job{ID: id, State: state, Comment: cfg.comment(workerName(cfg.name, prof))}
	}
	theirs := sbatch.Tag{Engine: "another", Epoch: cfg.epoch, Worker: workerName(cfg.name, prof)}.Comment()
	q.jobs = []queue.Job{ours("5", "PENDING"), {ID: "6", State: "RUNNING", Comment: theirs}, ours("7", "RUNNING")}
	p.mu.Lock()
	p.host, p.adoption.adoptPending = host, true
	p.mu.Unlock()

	resp, err := p.Shutdown(context.Background(), &shared.ShutdownRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(resp.Cancelled, []string{"5", "7"}) || len(q.jobs) != 1 || q.jobs[0].ID != "6" {
		t.Errorf("cancelled %v, the queue left with %+v; want 5 and 7 cancelled and another engine's 6 left", resp.Cancelled, q.jobs)
	}
	if evs := host.Events(); len(evs) != 2 || evs[0].Kind != shared.EventWorkerCancelled || evs[1].Kind != shared.EventWorkerCancelled {
		t.Errorf("events %+v; want worker_cancelled for each", evs)
	}
}

// TestAdoptTakesOursAndCancelsStrays, against an in-memory queue: at the
// first look, a pending job of a configured profile is adopted into the
// books (the engine hears worker_provisioned), and one whose tag names
// no worker of a configured profile is cancelled, since nobody would
// use it.
func TestAdoptTakesOursAndCancelsStrays(t *testing.T) {
	q := &memQueue{}
	p, cfg := memProvisioner(t, q)
	host := newFakeHost()
	worker := workerName(cfg.name, cfg.Profiles[0].Name)
	q.jobs = []queue.Job{
		{ID: "11", State: "PENDING", Comment: cfg.comment(worker)},
		{ID: "12", State: "PENDING", Comment: cfg.comment(cfg.name + "-nosuchprofile-0123abcd")},
	}
	p.mu.Lock()
	p.adoption.adoptPending, p.adoption.mine = true, map[string]bool{}
	p.mu.Unlock()

	p.adoption.adopt(context.Background(), cfg, host, slices.Clone(q.jobs))
	p.mu.Lock()
	r := p.outstanding[worker]
	pending := p.adoption.adoptPending
	p.mu.Unlock()
	if r == nil || r.job != "11" || pending {
		t.Errorf("adopted %+v, adoption pending %v; want worker %s's job 11 in the books and adoption done", r, pending, worker)
	}
	if len(q.jobs) != 1 || q.jobs[0].ID != "11" || len(q.cancelled) != 1 || !slices.Equal(q.cancelled[0], []string{"12"}) {
		t.Errorf("the queue left with %+v after scancels %v; want the stray 12 cancelled alone", q.jobs, q.cancelled)
	}
	var got []shared.EventKind
	for _, ev := range host.Events() {
		got = append(got, ev.Kind)
	}
	if !slices.Contains(got, shared.EventWorkerProvisioned) || !slices.Contains(got, shared.EventWorkerCancelled) {
		t.Errorf("events %v; want worker_provisioned for the adopted and worker_cancelled for the stray", got)
	}
}

// TestAdoptKeepsTheCaps, against an in-memory queue: a pending job of
// this engine found in the queue that the books do not hold (a
// submission that went on after it was given up on, or one a killed
// predecessor left in flight) is adopted while max_workers leaves room
// for it, and cancelled, newest first, where it would put the
// provisioner over max_workers; at the first look too, for an earlier
// run's pending jobs beyond a cap lowered since. A running job is kept
// whatever the count: its worker may be at work.
func TestAdoptKeepsTheCaps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first bool
		// books are this run's machines in the books, by job; found the
		// jobs the queue holds beside them, each a machine of its own,
		// with its state.
		books   []string
		found   map[string]string
		max     int
		adopted []string
		gone    []string
	}{
		{name: "room for one of two", books: []string{"20", "21"}, found: map[string]string{"22": "PENDING", "23": "PENDING"}, max: 3, adopted: []string{"22"}, gone: []string{"23"}},
		{name: "room for both", books: []string{"20", "21"}, found: map[string]string{"22": "PENDING", "23": "PENDING"}, max: 4, adopted: []string{"22", "23"}},
		{name: "array tasks, newest first", books: []string{"20"}, found: map[string]string{"22_0": "PENDING", "22_1": "PENDING", "9_5": "PENDING"}, max: 2, adopted: []string{"9_5"}, gone: []string{"22_0", "22_1"}},
		{name: "first look, a cap lowered", first: true, found: map[string]string{"5": "RUNNING", "6": "PENDING", "7": "PENDING", "8": "RUNNING"}, max: 3, adopted: []string{"5", "6", "8"}, gone: []string{"7"}},
		{name: "first look, running beyond the cap", first: true, found: map[string]string{"5": "RUNNING", "6": "RUNNING", "7": "PENDING"}, max: 1, adopted: []string{"5", "6"}, gone: []string{"7"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := &memQueue{}
			p, cfg := memProvisioner(t, q)
			*cfg.MaxWorkers = tc.max
			host := newFakeHost()
			p.mu.Lock()
			for _, job := range tc.books {
				w := workerName(cfg.name, "cpu")
				p.outstanding[w] = &request{profile: "cpu", worker: w, tag: w, task: -1, node: -1, nodes: 1, batch: 1,
					cancel: func() {}, done: closedDone, job: job, slurmState: "PENDING", phase: phaseQueued}
				q.jobs = append(q.jobs, queue.Job{ID: job, State: "PENDING", Comment: cfg.comment(w)})
			}
			if tc.first {
				p.adoption.adoptPending, p.adoption.mine = true, map[string]bool{}
			}
			p.mu.Unlock()
			tags := map[string]string{}
			for id, state := range tc.found {
				job, _ := sbatch.SplitTask(id)
				if tags[job] == "" {
					tags[job] = workerName(cfg.name, "cpu")
				}
				q.jobs = append(q.jobs, queue.Job{ID: id, State: state, Comment: cfg.comment(tags[job])})
			}

			p.adoption.adopt(context.Background(), cfg, host, slices.Clone(q.jobs))
			var adopted []string
			p.mu.Lock()
			for _, r := range p.outstanding {
				if !slices.Contains(tc.books, r.job) {
					adopted = append(adopted, r.job)
				}
			}
			p.mu.Unlock()
			slices.Sort(adopted)
			var gone []string
			for _, ids := range q.cancelled {
				gone = append(gone, ids...)
			}
			slices.Sort(gone)
			if !slices.Equal(adopted, tc.adopted) || !slices.Equal(gone, tc.gone) {
				t.Errorf("max_workers %d: adopted %v and cancelled %v; want %v adopted and %v cancelled", tc.max, adopted, gone, tc.adopted, tc.gone)
			}
			for _, ev := range host.Events() {
				if ev.Kind == shared.EventWorkerProvisioned && slices.Contains(tc.gone, ev.Job) {
					t.Errorf("the engine heard %s provisioned, which was cancelled", ev.Job)
				}
			}
		})
	}
}

// TestAdoptRelayCancelsWhatTheDeadRelayServed, against an in-memory
// queue: at a relay plugin's first look, a running job whose worker the
// engine still counts attached (it attached through the dead relay) is
// cancelled with the rest of the earlier run's jobs, not taken for this
// run's: its worker pins a certificate that died with that relay, and
// its job would hold a machine of max_workers nobody can use (seed 4242
// of the soak: 11 alive under 10).
func TestAdoptRelayCancelsWhatTheDeadRelayServed(t *testing.T) {
	q := &memQueue{}
	p, cfg := memProvisioner(t, q)
	p.relay = &relay{tls: &relayd.Cert{}}
	host := newFakeHost()
	worker := workerName(cfg.name, "cpu")
	q.jobs = []queue.Job{{ID: "40", State: "RUNNING", Comment: cfg.comment(worker)}}
	p.mu.Lock()
	p.adoption.adoptPending, p.adoption.mine = true, map[string]bool{}
	p.workers.reconciled = map[string]struct{}{worker: {}}
	p.mu.Unlock()
	p.adoption.adopt(context.Background(), cfg, host, slices.Clone(q.jobs))
	if len(q.cancelled) != 1 || !slices.Equal(q.cancelled[0], []string{"40"}) {
		t.Errorf("scancels %v; want job 40 cancelled, its worker attached through the dead relay", q.cancelled)
	}
}
