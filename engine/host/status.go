package host

import (
	"encoding/json"
	"time"

	"github.com/fluksio/provision/internal/termsafe"
	"github.com/fluksio/provision/shared"
)

// ProvisionerStatus is one supervised provisioner as an operator sees it.
type ProvisionerStatus struct {
	// Name is the provisioner's name in the configuration.
	Name string
	// Kind is its plugin's kind, such as "slurm".
	Kind string
	// Phase is where the plugin stands; Restarts counts restarts after
	// it exited on its own; LastExit says how it last exited ("" if it
	// never did); Wedged says why it was last killed for missing its
	// deadlines; Failure why the phase is PhaseFailed.
	Phase    Phase
	Restarts int
	LastExit string
	Wedged   string
	Failure  string
	// Process is the line an operator reads, rendered from the fields
	// above ("running", "running (restarts: 1, last exit: killed by
	// signal killed)", "failed: …"). Read Phase, not this.
	Process string
	// Status is the plugin's own report, nil if it could not be had.
	Status *shared.StatusResponse
	// Error is why Status is nil, or anything else wrong.
	Error string
	// LastExitStderr is what the plugin last wrote before it last exited
	// on its own: a panic's trace, or why it gave up.
	LastExitStderr []string
	// OutstandingTotal is how many outstanding jobs the plugin reported,
	// for an engine that lists only some of them; the engine's
	// supervisor leaves it zero.
	OutstandingTotal int
}

// MarshalJSON renders the status in snake_case. shared's types carry no
// JSON tags (they are the contract, not a wire format), so the rendering
// lives here, one for every engine that shows it.
func (p ProvisionerStatus) MarshalJSON() ([]byte, error) {
	type outstanding struct {
		Profile    string  `json:"profile"`
		Job        string  `json:"job"`
		Worker     string  `json:"worker"`
		AgeSeconds float64 `json:"age_seconds"`
		State      string  `json:"state,omitempty"`
		// Reason is why the scheduler holds a pending job (contract 2.6).
		Reason string `json:"reason,omitempty"`
	}
	type backoff struct {
		Profile   string    `json:"profile"`
		Failures  int       `json:"failures"`
		Until     time.Time `json:"until"`
		LastError string    `json:"last_error"`
	}
	type submission struct {
		Job        string  `json:"job"`
		Machines   int     `json:"machines"`
		OnTheWay   int     `json:"on_the_way"`
		AgeSeconds float64 `json:"age_seconds"`
	}
	type counts struct {
		Profile     string       `json:"profile"`
		Pending     int          `json:"pending"`
		Starting    int          `json:"starting"`
		Attached    int          `json:"attached"`
		Submissions []submission `json:"submissions"`
	}
	type status struct {
		Name        string        `json:"name"`
		Kind        string        `json:"kind"`
		Profiles    []string      `json:"profiles"`
		Counts      []counts      `json:"counts"`
		Outstanding []outstanding `json:"outstanding"`
		BackingOff  []backoff     `json:"backing_off"`
		LastError   string        `json:"last_error"`
		Notes       []string      `json:"notes"`
	}
	out := struct {
		Name           string   `json:"name"`
		Kind           string   `json:"kind"`
		Phase          *Phase   `json:"phase,omitempty"`
		Restarts       int      `json:"restarts"`
		Process        string   `json:"process"`
		LastExitStderr []string `json:"last_exit_stderr,omitempty"`
		Status         *status  `json:"status"`
		Error          string   `json:"error,omitempty"`
		// Total counts outstanding jobs, listed or not.
		OutstandingTotal int `json:"outstanding_total"`
	}{Name: p.Name, Kind: p.Kind, Restarts: p.Restarts, Process: p.Process, LastExitStderr: p.LastExitStderr, Error: p.Error, OutstandingTotal: p.OutstandingTotal}
	if p.Phase != 0 {
		out.Phase = &p.Phase
	}
	if s := p.Status; s != nil {
		out.Status = &status{
			Name: s.Name, Kind: s.Kind, LastError: s.LastError,
			Profiles:    append([]string{}, s.Profiles...),
			Outstanding: []outstanding{},
			BackingOff:  []backoff{},
			Counts:      []counts{},
			Notes:       append([]string{}, s.Notes...),
		}
		for _, c := range s.Counts {
			pc := counts{Profile: c.Profile, Pending: c.Pending, Starting: c.Starting, Attached: c.Attached, Submissions: []submission{}}
			for _, sub := range c.Submissions {
				pc.Submissions = append(pc.Submissions, submission{Job: sub.Job, Machines: sub.Machines, OnTheWay: sub.OnTheWay,
					AgeSeconds: sub.Age.Round(100 * time.Millisecond).Seconds()})
			}
			out.Status.Counts = append(out.Status.Counts, pc)
		}
		for _, b := range s.BackingOff {
			out.Status.BackingOff = append(out.Status.BackingOff, backoff{Profile: b.Profile, Failures: b.Failures, Until: b.Until, LastError: b.LastError})
		}
		for _, o := range s.Outstanding {
			out.Status.Outstanding = append(out.Status.Outstanding, outstanding{
				Profile: o.Profile, Job: o.Job, Worker: o.Worker, State: o.State, Reason: termsafe.EscapeLine(o.Reason),
				AgeSeconds: o.Age.Round(100 * time.Millisecond).Seconds(),
			})
		}
	}
	return json.Marshal(out)
}
