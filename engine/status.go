package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/fluksio/provision/engine/host"
)

// statusPage serves the operator's GET /status: the engine's identity,
// its provisioners (through a cache: at most one Status call per plugin
// a second, shared with the metrics), the workers from the books, and
// the needs and the profiles held back from the router. New builds it
// from the parts it reads; Mux routes it behind the operator's guard.
type statusPage struct {
	id string
	// version is the engine's configuration generation and digest.
	version *configVersion
	books   *books
	// provisioners, needs and held read the fleet and the router; each
	// may be nil, and lists none then. provisioners is called with the
	// request's context and no lock of the books', so it may cross the
	// plugin boundary.
	provisioners func(context.Context) []host.ProvisionerStatus
	needs        func(needQuery) needsAnswer
	held         func() []HeldProfile
	// tasks counts the tasks by state; nil counts none.
	tasks func() TaskCounts
	cache statusCache
}

// provisionerStatus is the provisioners' status through the cache, for
// GET /status and the metrics alike.
func (s *statusPage) provisionerStatus(ctx context.Context) []host.ProvisionerStatus {
	if s.provisioners == nil {
		return nil
	}
	return s.cache.get(ctx, s.provisioners)
}

// statusReport is GET /status's answer.
type statusReport struct {
	EngineID string `json:"engine_id"`
	// Config is which configuration the engine runs.
	Config       ConfigVersion            `json:"config"`
	Provisioners []host.ProvisionerStatus `json:"provisioners"`
	Workers      []workerStatus           `json:"workers"`
	Needs        []NeedStatus             `json:"needs"`
	// HeldBack is the engine's own backoff (backoff.go): profiles whose
	// machines failed in a row, whatever their plugin does about it.
	HeldBack []HeldProfile `json:"held_back"`
	// Summary counts everything, whatever the lists hold.
	Summary statusSummary `json:"summary"`
	// WorkersTotal is how many workers are attached, NeedsMatched how
	// many needs match the query's state; the lists hold the first
	// ?limit of each.
	WorkersTotal int `json:"workers_total"`
	NeedsMatched int `json:"needs_matched"`
}

// statusSummary is the run in numbers: the tasks by state (every task
// submitted), the needs by state and the waiting ones by reason, and the
// workers, busy and idle.
type statusSummary struct {
	Tasks   TaskCounts   `json:"tasks"`
	Needs   NeedCounts   `json:"needs"`
	Workers WorkerCounts `json:"workers"`
}

// WorkerCounts is the attached workers, busy (holding a task, or its
// result not yet recorded) and idle.
type WorkerCounts struct {
	Attached int `json:"attached"`
	Busy     int `json:"busy"`
	Idle     int `json:"idle"`
	// CPUs are the attached workers' CPUs, CPUsBusy those their tasks
	// take (a worker with slots runs as many tasks as it holds).
	CPUs     int `json:"cpus"`
	CPUsBusy int `json:"cpus_busy"`
	// ByProvisioner is the same, for each provisioner's workers.
	ByProvisioner map[string]ProvisionerWorkers `json:"by_provisioner,omitempty"`
}

// ProvisionerWorkers is one provisioner's attached workers and their
// CPUs, busy and in all.
type ProvisionerWorkers struct {
	Attached int `json:"attached"`
	Busy     int `json:"busy"`
	CPUs     int `json:"cpus"`
	CPUsBusy int `json:"cpus_busy"`
}

// Counts is the run in numbers, as GET /status's summary has them: the
// tasks by state (every task submitted) and the needs by state and
// reason. It lists nothing, so it costs a count of the needs, not a
// NeedStatus each: a progress line may read it every second with
// 100,000 tasks queued.
func (e *Engine) Counts() (TaskCounts, NeedCounts) {
	return e.tasks.counts(), e.router.needsWhere(needQuery{limit: 0}).summary
}

// parseStatusQuery reads GET /status's query: ?limit=N lists at most N
// workers and N needs (all without it), ?state=S[,S...] lists the needs
// whose state, task state or waiting reason is one of them.
func parseStatusQuery(r *http.Request) (needQuery, error) {
	q := needQuery{limit: -1}
	v := r.URL.Query()
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 {
			return q, fmt.Errorf("limit=%q: give a whole number of elements, 0 or more, or leave it out for all", l)
		}
		q.limit = n
	}
	for _, st := range strings.Split(v.Get("state"), ",") {
		if st = strings.TrimSpace(st); st != "" {
			if q.states == nil {
				q.states = map[string]bool{}
			}
			q.states[st] = true
		}
	}
	return q, nil
}

func (s *statusPage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q, err := parseStatusQuery(r)
	if err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	// Empty lists, not null: a status page reads .length without asking.
	report := statusReport{EngineID: s.id, Provisioners: []host.ProvisionerStatus{}, Workers: []workerStatus{}, Needs: []NeedStatus{}, HeldBack: []HeldProfile{}}
	report.Summary.Needs.ByReason = map[WaitReason]int{}
	report.Summary.Tasks.Ended.Counts = []int{}
	if s.version != nil {
		report.Config = s.version.get()
	}
	if s.held != nil {
		report.HeldBack = s.held()
	}
	if s.provisioners != nil {
		report.Provisioners = s.provisionerStatus(r.Context())
	}
	var out map[string]string
	if s.tasks != nil {
		report.Summary.Tasks = s.tasks()
	}
	if s.needs != nil {
		ans := s.needs(q)
		if ans.list != nil {
			report.Needs = ans.list
		}
		report.NeedsMatched, report.Summary.Needs, out = ans.matched, ans.summary, ans.out
	}
	// The workers are read after the needs: what the books say a worker
	// holds is as new as the needs or newer.
	workers := s.books.statuses()
	report.reconcile(workers, out)
	report.WorkersTotal = len(workers)
	report.Workers = workers
	if q.limit >= 0 && len(workers) > q.limit {
		report.Workers = workers[:q.limit]
	}
	report.stream(w)
}

// reconcile makes the needs and the workers of one answer agree on who
// holds what. The needs were read first: a need listed as assigned whose
// worker the books now show holding another attempt, or none, has ended
// since (its result recorded, or its worker gone), and is shown on no
// worker. A worker doing the stand-in's work is shown with its need's
// id (out: the need of every attempt out, by attempt id). It also
// counts the workers, busy and idle.
func (report *statusReport) reconcile(workers []workerStatus, out map[string]string) {
	holds := make(map[string]bool, len(workers))
	sum := &report.Summary.Workers
	for i := range workers {
		w := &workers[i]
		byProv := sum.ByProvisioner[w.Provisioner]
		byProv.Attached++
		byProv.CPUs += w.CPUs
		byProv.CPUsBusy += w.CPUsBusy
		sum.CPUs += w.CPUs
		sum.CPUsBusy += w.CPUsBusy
		if w.AttemptID != "" {
			byProv.Busy++
		}
		if sum.ByProvisioner == nil {
			sum.ByProvisioner = map[string]ProvisionerWorkers{}
		}
		sum.ByProvisioner[w.Provisioner] = byProv
		if w.AttemptID == "" {
			sum.Idle++
			continue
		}
		sum.Busy++
		for _, id := range w.AttemptIDs {
			holds[w.Name+"\x00"+id] = true
		}
		if w.Task == "" {
			w.Task = out[w.AttemptID]
		}
	}
	sum.Attached = len(workers)
	for i := range report.Needs {
		n := &report.Needs[i]
		if n.State == NeedAssigned && n.Worker != "" && !holds[n.Worker+"\x00"+n.AttemptID] {
			n.Detail = fmt.Sprintf("ended on %s; being recorded", n.Worker)
			n.Worker = ""
		}
	}
}

// stream writes the report as statusReport's JSON, its two long lists
// (workers and needs) one element at a time, each on a line of its own,
// so that the answer is never whole in memory: encoded whole, a large
// answer leaves buffers of its size behind it (encoding/json keeps its
// own in a pool, and writeJSON's is another). The cost: no
// Content-Length (the body is chunked), and an encoding error found part
// way through cannot become a 500; the connection is then cut, so that a
// reader sees a broken answer rather than a short one.
func (report statusReport) stream(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	js := newJSONStream(w)
	js.raw(`{"engine_id":`)
	js.value(report.EngineID)
	js.raw(`,"config":`)
	js.value(report.Config)
	js.raw(",\n\"provisioners\":")
	js.value(report.Provisioners)
	js.raw(",\n\"workers\":[")
	for i := range report.Workers {
		js.element(i, &report.Workers[i])
	}
	js.raw("\n],\n\"needs\":[")
	for i := range report.Needs {
		js.element(i, &report.Needs[i])
	}
	js.raw("\n],\n\"held_back\":")
	js.value(report.HeldBack)
	js.raw(",\n\"summary\":")
	js.value(report.Summary)
	js.raw(",\n\"workers_total\":")
	js.value(report.WorkersTotal)
	js.raw(",\"needs_matched\":")
	js.value(report.NeedsMatched)
	js.raw("}\n")
	if js.err == nil {
		js.err = js.w.Flush()
	}
	if js.err != nil {
		panic(http.ErrAbortHandler)
	}
}

// jsonStream writes a JSON document in parts, each value encoded into a
// buffer of its own size; the first error stops it.
type jsonStream struct {
	w   *bufio.Writer
	buf bytes.Buffer
	enc *json.Encoder
	err error
}

func newJSONStream(w io.Writer) *jsonStream {
	js := &jsonStream{w: bufio.NewWriterSize(w, 32<<10)}
	js.enc = json.NewEncoder(&js.buf)
	return js
}

func (js *jsonStream) raw(s string) {
	if js.err == nil {
		_, js.err = js.w.WriteString(s)
	}
}

// value writes v without the newline json.Encoder ends it with.
func (js *jsonStream) value(v any) {
	if js.err != nil {
		return
	}
	js.buf.Reset()
	if js.err = js.enc.Encode(v); js.err == nil {
		_, js.err = js.w.Write(bytes.TrimSuffix(js.buf.Bytes(), []byte("\n")))
	}
}

// element writes v as the i-th element of a list, on a line of its own.
func (js *jsonStream) element(i int, v any) {
	if i > 0 {
		js.raw(",")
	}
	js.raw("\n")
	js.value(v)
}
