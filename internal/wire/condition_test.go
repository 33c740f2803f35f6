package wire

import (
	"context"
	"strings"
	"testing"

	"github.com/fluksio/provision/internal/pb"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"
)

// TestConditionRoundTrip: every condition a plugin sets on an outcome
// reaches the host as itself over gRPC; each is the proto's value of the
// same name (CONDITION_LOGIN_NEEDED is "login_needed"), and the proto has
// no value this package leaves out. A value the host does not know (a
// newer plugin's) reads as ConditionNone, so the outcome is read alone.
func TestConditionRoundTrip(t *testing.T) {
	var sent []shared.DemandOutcome
	for _, m := range conditions {
		sent = append(sent, shared.DemandOutcome{Outcome: shared.OutcomeCapped, Profile: "p", Detail: m.c.String(), Condition: m.c})
	}
	c := inMemory(t, &sharedtest.Provisioner{ProvisionF: func(context.Context, *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
		return &shared.ProvisionResponse{Outcomes: sent}, nil
	}})
	r, err := c.Provision(context.Background(), &shared.ProvisionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Outcomes) != len(sent) {
		t.Fatalf("%d outcomes back for %d sent", len(r.Outcomes), len(sent))
	}
	for i, o := range r.Outcomes {
		if o != sent[i] {
			t.Errorf("sent %+v, the host read %+v", sent[i], o)
		}
	}

	seen := map[pb.Condition]bool{}
	for _, m := range conditions {
		seen[m.p] = true
		if want := strings.ToLower(strings.TrimPrefix(m.p.String(), "CONDITION_")); m.c.String() != want {
			t.Errorf("shared.Condition %d is %q, its wire value %s", m.c, m.c, m.p)
		}
		if got := conditionFromProto(conditionToProto(m.c)); got != m.c {
			t.Errorf("%s came back as %s", m.c, got)
		}
	}
	for v, name := range pb.Condition_name {
		if !seen[pb.Condition(v)] {
			t.Errorf("the proto's %s has no shared.Condition", name)
		}
	}
	if got := conditionFromProto(pb.Condition(99)); got != shared.ConditionNone {
		t.Errorf("an unknown condition reads as %s; want none", got)
	}
}
