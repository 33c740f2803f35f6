package host

import (
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// TestProvisionerStatusJSON: a plugin's per-profile counts, the
// submissions behind them and its notes reach an operator's page.
func TestProvisionerStatusJSON(t *testing.T) {
	t.Parallel()
	ps := ProvisionerStatus{Name: "hpc", Kind: "slurm", Process: "running", Status: &shared.StatusResponse{
		Counts: []shared.ProfileCounts{{Profile: "cpu", Pending: 6, Starting: 1, Attached: 3,
			Submissions: []shared.Submission{{Job: "77", Machines: 10, OnTheWay: 7, Age: 1500 * time.Millisecond}}}},
		Notes: []string{"job arrays refused"},
	}}
	b, err := ps.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"counts":[{"profile":"cpu","pending":6,"starting":1,"attached":3,"submissions":[{"job":"77","machines":10,"on_the_way":7,"age_seconds":1.5}]}]`, `"notes":["job arrays refused"]`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("status JSON lacks %s:\n%s", want, b)
		}
	}
}
