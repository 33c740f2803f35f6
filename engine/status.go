package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"

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
	needs        func() []NeedStatus
	held         func() []HeldProfile
	cache        host.StatusCache
}

// provisionerStatus is the provisioners' status through the cache, for
// GET /status and the metrics alike.
func (s *statusPage) provisionerStatus(ctx context.Context) []host.ProvisionerStatus {
	if s.provisioners == nil {
		return nil
	}
	return s.cache.Get(ctx, s.provisioners)
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
}

func (s *statusPage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Empty lists, not null: a status page reads .length without asking.
	report := statusReport{EngineID: s.id, Provisioners: []host.ProvisionerStatus{}, Workers: []workerStatus{}, Needs: []NeedStatus{}, HeldBack: []HeldProfile{}}
	if s.version != nil {
		report.Config = s.version.get()
	}
	if s.held != nil {
		report.HeldBack = s.held()
	}
	if s.provisioners != nil {
		report.Provisioners = s.provisionerStatus(r.Context())
	}
	if s.needs != nil {
		if needs := s.needs(); needs != nil {
			report.Needs = needs
		}
	}
	report.Workers = s.books.statuses()
	report.stream(w)
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
