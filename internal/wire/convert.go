package wire

import (
	"encoding/json"
	"time"

	"github.com/fluksio/provision/internal/clip"
	"github.com/fluksio/provision/internal/pb"
	"github.com/fluksio/provision/shared"
)

// The converters below are the only code that knows both the domain types
// and the generated ones. They are deliberately dull: one function a type
// and direction, nil in gives zero out, so a field added to the proto is
// one line here and nowhere else.

func needToProto(n shared.Need) *pb.Need {
	return &pb.Need{Cpus: int64(n.CPUs), Gpus: int64(n.GPUs), RamMb: n.RAMMB, Label: n.Label, LifetimeSeconds: n.Lifetime.Seconds()}
}

func needFromProto(n *pb.Need) shared.Need {
	return shared.Need{CPUs: int(n.GetCpus()), GPUs: int(n.GetGpus()), RAMMB: n.GetRamMb(), Label: n.GetLabel(), Lifetime: lifetime(n.GetLifetimeSeconds())}
}

func shapesToProto(in []shared.Shape) []*pb.Shape {
	out := make([]*pb.Shape, 0, len(in))
	for _, s := range in {
		out = append(out, &pb.Shape{Profile: s.Profile, Cpus: int64(s.CPUs), Gpus: int64(s.GPUs), RamMb: s.RAMMB, Labels: s.Labels,
			LifetimeSeconds: s.Lifetime.Seconds(), LifetimeFrom: s.LifetimeFrom})
	}
	return out
}

func shapesFromProto(in []*pb.Shape) []shared.Shape {
	out := make([]shared.Shape, 0, len(in))
	for _, s := range in {
		out = append(out, shared.Shape{Profile: s.GetProfile(), CPUs: int(s.GetCpus()), GPUs: int(s.GetGpus()), RAMMB: s.GetRamMb(), Labels: s.GetLabels(),
			Lifetime: lifetime(s.GetLifetimeSeconds()), LifetimeFrom: s.GetLifetimeFrom()})
	}
	return out
}

func schemaToProto(s *shared.Schema) (*pb.Schema, error) {
	if s == nil {
		return nil, nil
	}
	out := &pb.Schema{}
	for _, a := range s.Attributes {
		var def []byte
		if a.Default != nil {
			var err error
			if def, err = json.Marshal(a.Default); err != nil {
				return nil, err
			}
		}
		out.Attributes = append(out.Attributes, &pb.Attribute{
			Name: a.Name, Type: string(a.Type), Required: a.Required,
			Description: a.Description, DefaultJson: def, Sensitive: a.Sensitive,
		})
	}
	for _, b := range s.Blocks {
		body, err := schemaToProto(b.Body)
		if err != nil {
			return nil, err
		}
		out.Blocks = append(out.Blocks, &pb.BlockType{
			Name: b.Name, Labels: b.Labels, Description: b.Description, Body: body,
			MinItems: int32(b.MinItems), MaxItems: int32(b.MaxItems),
		})
	}
	return out, nil
}

func schemaFromProto(s *pb.Schema) (*shared.Schema, error) {
	if s == nil {
		return nil, nil
	}
	out := &shared.Schema{}
	for _, a := range s.GetAttributes() {
		var def any
		if len(a.GetDefaultJson()) > 0 {
			if err := json.Unmarshal(a.GetDefaultJson(), &def); err != nil {
				return nil, err
			}
		}
		out.Attributes = append(out.Attributes, shared.Attribute{
			Name: a.GetName(), Type: shared.Type(a.GetType()), Required: a.GetRequired(),
			Description: a.GetDescription(), Default: def, Sensitive: a.GetSensitive(),
		})
	}
	for _, b := range s.GetBlocks() {
		body, err := schemaFromProto(b.GetBody())
		if err != nil {
			return nil, err
		}
		out.Blocks = append(out.Blocks, shared.BlockType{
			Name: b.GetName(), Labels: b.GetLabels(), Description: b.GetDescription(), Body: body,
			MinItems: int(b.GetMinItems()), MaxItems: int(b.GetMaxItems()),
		})
	}
	return out, nil
}

func diagsToProto(in shared.Diagnostics) []*pb.Diagnostic {
	out := make([]*pb.Diagnostic, 0, len(in))
	for _, d := range in {
		sev := pb.Diagnostic_ERROR
		if d.Severity == shared.SeverityWarning {
			sev = pb.Diagnostic_WARNING
		}
		out = append(out, &pb.Diagnostic{Severity: sev, Summary: d.Summary, Detail: d.Detail, Path: d.Path})
	}
	return out
}

func diagsFromProto(in []*pb.Diagnostic) shared.Diagnostics {
	var out shared.Diagnostics
	for _, d := range in {
		// An unspecified severity is treated as an error: a plugin that
		// forgot to say is more likely reporting a problem than a hint.
		sev := shared.SeverityError
		if d.GetSeverity() == pb.Diagnostic_WARNING {
			sev = shared.SeverityWarning
		}
		out = append(out, shared.Diagnostic{Severity: sev, Summary: d.GetSummary(), Detail: d.GetDetail(), Path: d.GetPath()})
	}
	return out
}

func outcomeToProto(o shared.ProvisionOutcome) pb.ProvisionResponse_Outcome {
	switch o {
	case shared.OutcomeRequested:
		return pb.ProvisionResponse_REQUESTED
	case shared.OutcomeOutstanding:
		return pb.ProvisionResponse_OUTSTANDING
	case shared.OutcomeNoFit:
		return pb.ProvisionResponse_NO_FIT
	case shared.OutcomeBackingOff:
		return pb.ProvisionResponse_BACKING_OFF
	case shared.OutcomeCapped:
		return pb.ProvisionResponse_CAPPED
	}
	return pb.ProvisionResponse_OUTCOME_UNSPECIFIED
}

func outcomeFromProto(o pb.ProvisionResponse_Outcome) shared.ProvisionOutcome {
	switch o {
	case pb.ProvisionResponse_REQUESTED:
		return shared.OutcomeRequested
	case pb.ProvisionResponse_OUTSTANDING:
		return shared.OutcomeOutstanding
	case pb.ProvisionResponse_NO_FIT:
		return shared.OutcomeNoFit
	case pb.ProvisionResponse_BACKING_OFF:
		return shared.OutcomeBackingOff
	case pb.ProvisionResponse_CAPPED:
		return shared.OutcomeCapped
	}
	return 0
}

// conditions pairs each shared.Condition with its wire value.
var conditions = []struct {
	c shared.Condition
	p pb.Condition
}{
	{shared.ConditionNone, pb.Condition_CONDITION_NONE},
	{shared.ConditionCap, pb.Condition_CONDITION_CAP},
	{shared.ConditionSiteLimit, pb.Condition_CONDITION_SITE_LIMIT},
	{shared.ConditionThrottled, pb.Condition_CONDITION_THROTTLED},
	{shared.ConditionClusterFull, pb.Condition_CONDITION_CLUSTER_FULL},
	{shared.ConditionLoginNeeded, pb.Condition_CONDITION_LOGIN_NEEDED},
	{shared.ConditionBackingOff, pb.Condition_CONDITION_BACKING_OFF},
	{shared.ConditionMisconfigured, pb.Condition_CONDITION_MISCONFIGURED},
}

func conditionToProto(c shared.Condition) pb.Condition {
	for _, m := range conditions {
		if m.c == c {
			return m.p
		}
	}
	return pb.Condition_CONDITION_NONE
}

// conditionFromProto reads a condition off the wire; one this host does
// not know (a newer plugin's) is ConditionNone: the outcome is read alone.
func conditionFromProto(c pb.Condition) shared.Condition {
	for _, m := range conditions {
		if m.p == c {
			return m.c
		}
	}
	return shared.ConditionNone
}

func capabilitiesToProto(cs []shared.Capability) []string {
	if cs == nil {
		return nil
	}
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = string(c)
	}
	return out
}

func capabilitiesFromProto(cs []string) []shared.Capability {
	if cs == nil {
		return nil
	}
	out := make([]shared.Capability, len(cs))
	for i, c := range cs {
		out[i] = shared.Capability(c)
	}
	return out
}

func provisionRequestToProto(r *shared.ProvisionRequest) *pb.ProvisionRequest {
	out := &pb.ProvisionRequest{Attached: r.Attached}
	for _, d := range r.Demand {
		out.Demand = append(out.Demand, &pb.Demand{Need: needToProto(d.Need), Count: int64(d.Count)})
	}
	return out
}

func provisionRequestFromProto(r *pb.ProvisionRequest) *shared.ProvisionRequest {
	out := &shared.ProvisionRequest{Attached: r.GetAttached()}
	for _, d := range r.GetDemand() {
		out.Demand = append(out.Demand, shared.Demand{Need: needFromProto(d.GetNeed()), Count: clampInt(d.GetCount())})
	}
	return out
}

func provisionResponseToProto(r *shared.ProvisionResponse) *pb.ProvisionResponse {
	out := &pb.ProvisionResponse{}
	for _, o := range r.Outcomes {
		out.Outcomes = append(out.Outcomes, &pb.DemandOutcome{Outcome: outcomeToProto(o.Outcome), Profile: o.Profile, Detail: o.Detail,
			Condition: conditionToProto(o.Condition)})
	}
	for _, p := range r.Profiles {
		out.Profiles = append(out.Profiles, &pb.ProfileDemand{Profile: p.Profile, Wanted: int64(p.Wanted), OnTheWay: int64(p.OnTheWay),
			Attached: int64(p.Attached), Requested: int64(p.Requested), Submissions: int64(p.Submissions), Cancelled: int64(p.Cancelled)})
	}
	return out
}

func provisionResponseFromProto(r *pb.ProvisionResponse) *shared.ProvisionResponse {
	out := &shared.ProvisionResponse{}
	for _, o := range r.GetOutcomes() {
		out.Outcomes = append(out.Outcomes, shared.DemandOutcome{Outcome: outcomeFromProto(o.GetOutcome()), Profile: o.GetProfile(), Detail: clip.Bytes(o.GetDetail(), MaxEventDetail),
			Condition: conditionFromProto(o.GetCondition())})
	}
	for _, p := range r.GetProfiles() {
		out.Profiles = append(out.Profiles, shared.ProfileDemand{Profile: p.GetProfile(), Wanted: clampInt(p.GetWanted()),
			OnTheWay: clampInt(p.GetOnTheWay()), Attached: clampInt(p.GetAttached()), Requested: clampInt(p.GetRequested()),
			Submissions: clampInt(p.GetSubmissions()), Cancelled: clampInt(p.GetCancelled())})
	}
	return out
}

// clampInt reads a count off the wire: never negative, never beyond what
// an int holds on any platform the host runs on.
func clampInt(n int64) int {
	return int(max(0, min(n, 1<<31-1)))
}

func statusToProto(s *shared.StatusResponse) *pb.StatusResponse {
	out := &pb.StatusResponse{Name: s.Name, Kind: s.Kind, Profiles: s.Profiles, LastError: s.LastError}
	for _, o := range s.Outstanding {
		out.Outstanding = append(out.Outstanding, &pb.Outstanding{
			Profile: o.Profile, Job: o.Job, Worker: o.Worker, AgeSeconds: o.Age.Seconds(), State: o.State, Reason: o.Reason,
		})
	}
	for _, b := range s.BackingOff {
		out.BackingOff = append(out.BackingOff, &pb.Backoff{
			Profile: b.Profile, Failures: int32(b.Failures), UntilUnixNano: unixNano(b.Until), LastError: b.LastError,
		})
	}
	for _, c := range s.Counts {
		pc := &pb.ProfileCounts{Profile: c.Profile, Pending: int64(c.Pending), Starting: int64(c.Starting), Attached: int64(c.Attached)}
		for _, sub := range c.Submissions {
			pc.Submissions = append(pc.Submissions, &pb.Submission{Job: sub.Job, Machines: int64(sub.Machines), OnTheWay: int64(sub.OnTheWay), AgeSeconds: sub.Age.Seconds()})
		}
		out.Counts = append(out.Counts, pc)
	}
	out.Notes = s.Notes
	out.Counters = countersToProto(s.Counters)
	if r := s.Runtime; r != nil {
		out.Runtime = &pb.ProcessRuntime{HeapLiveBytes: r.HeapLiveBytes, HeapObjectsBytes: r.HeapObjectsBytes, Goroutines: r.Goroutines}
	}
	return out
}

func countersToProto(c *shared.Counters) *pb.Counters {
	if c == nil {
		return nil
	}
	out := &pb.Counters{}
	for _, f := range c.Failures {
		out.Failures = append(out.Failures, &pb.FailureCount{Profile: f.Profile, Class: string(f.Class), Count: f.Count})
	}
	for _, cs := range c.Commands {
		out.Commands = append(out.Commands, &pb.CommandStats{Command: cs.Command, Calls: cs.Calls, Errors: cs.Errors,
			SshErrors: cs.SSHErrors, Timeouts: cs.Timeouts, Rationed: cs.Rationed, Buckets: cs.Buckets, BucketCounts: cs.BucketCounts,
			DurationSumSeconds: cs.DurationSum.Seconds()})
	}
	return out
}

func countersFromProto(c *pb.Counters) *shared.Counters {
	if c == nil {
		return nil
	}
	out := &shared.Counters{}
	for _, f := range c.GetFailures() {
		out.Failures = append(out.Failures, shared.FailureCount{Profile: f.GetProfile(), Class: shared.FailureClass(f.GetClass()), Count: f.GetCount()})
	}
	for _, cs := range c.GetCommands() {
		out.Commands = append(out.Commands, shared.CommandStats{Command: cs.GetCommand(), Calls: cs.GetCalls(), Errors: cs.GetErrors(),
			SSHErrors: cs.GetSshErrors(), Timeouts: cs.GetTimeouts(), Rationed: cs.GetRationed(), Buckets: cs.GetBuckets(), BucketCounts: cs.GetBucketCounts(),
			DurationSum: seconds(cs.GetDurationSumSeconds())})
	}
	return out
}

func statusFromProto(s *pb.StatusResponse) *shared.StatusResponse {
	out := &shared.StatusResponse{Name: s.GetName(), Kind: s.GetKind(), Profiles: s.GetProfiles(), LastError: s.GetLastError()}
	for _, o := range s.GetOutstanding() {
		out.Outstanding = append(out.Outstanding, shared.Outstanding{
			Profile: o.GetProfile(), Job: o.GetJob(), Worker: o.GetWorker(),
			Age: seconds(o.GetAgeSeconds()), State: o.GetState(), Reason: o.GetReason(),
		})
	}
	for _, b := range s.GetBackingOff() {
		out.BackingOff = append(out.BackingOff, shared.Backoff{
			Profile: b.GetProfile(), Failures: int(b.GetFailures()), Until: fromUnixNano(b.GetUntilUnixNano()), LastError: b.GetLastError(),
		})
	}
	for _, c := range s.GetCounts() {
		pc := shared.ProfileCounts{Profile: c.GetProfile(), Pending: clampInt(c.GetPending()), Starting: clampInt(c.GetStarting()), Attached: clampInt(c.GetAttached())}
		for _, sub := range c.GetSubmissions() {
			pc.Submissions = append(pc.Submissions, shared.Submission{Job: sub.GetJob(), Machines: clampInt(sub.GetMachines()),
				OnTheWay: clampInt(sub.GetOnTheWay()), Age: seconds(sub.GetAgeSeconds())})
		}
		out.Counts = append(out.Counts, pc)
	}
	out.Notes = s.GetNotes()
	out.Counters = countersFromProto(s.GetCounters())
	if r := s.GetRuntime(); r != nil {
		out.Runtime = &shared.Runtime{HeapLiveBytes: r.GetHeapLiveBytes(), HeapObjectsBytes: r.GetHeapObjectsBytes(), Goroutines: r.GetGoroutines()}
	}
	return out
}

func eventToProto(e shared.Event) *pb.Event {
	return &pb.Event{
		Seq: e.Seq, Kind: string(e.Kind), Provisioner: e.Provisioner, Profile: e.Profile,
		Job: e.Job, Worker: e.Worker, TimeUnixNano: unixNano(e.Time), Detail: e.Detail,
		FailureClass: string(e.Class), JobState: e.JobState,
	}
}

func eventFromProto(e *pb.Event) shared.Event {
	return shared.Event{
		Seq: e.GetSeq(), Kind: shared.EventKind(e.GetKind()), Provisioner: e.GetProvisioner(), Profile: e.GetProfile(),
		Job: e.GetJob(), Worker: e.GetWorker(), Time: fromUnixNano(e.GetTimeUnixNano()), Detail: e.GetDetail(),
		Class: shared.FailureClass(e.GetFailureClass()), JobState: e.GetJobState(),
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// maxLifetime bounds a lifetime read off the wire, far above any job's
// time limit, so that a peer's nonsense cannot overflow a duration.
const maxLifetime = 100 * 365 * 24 * time.Hour

// lifetime is a lifetime in seconds off the wire: what is not a
// positive number is none (0), and what is larger than maxLifetime is
// maxLifetime.
func lifetime(s float64) time.Duration {
	if !(s > 0) {
		return 0
	}
	if s >= maxLifetime.Seconds() {
		return maxLifetime
	}
	return seconds(s)
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
