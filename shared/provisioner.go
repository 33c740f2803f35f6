package shared

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// ContractVersion is the version of the Provisioner contract this package
// speaks, reported by Info. Minor versions only add fields and methods;
// a plugin built against 2.x keeps working with any 2.y host.
//
// The version is written in shared/proto/provisioner.proto, which this
// constant must match (TestContractVersionHasOneSource). CHANGELOG.md at
// the module's root says what each version added.
const ContractVersion = "2.8"

// Provisioner is somewhere machines can be asked for.
//
// The shape is deliberately small: asking is not scheduling, and the
// engine's router already does the scheduling. Every method takes a request
// struct and returns a response struct, so that fields can be added to
// either without breaking anybody who implements or calls it.
//
// Methods may be called concurrently. A method that fails returns an error;
// a provisioner that answers "no" (no profile fits, one is already asked
// for) says so in its response, not as an error.
//
// The contract's rules are stated in shared/proto/provisioner.proto,
// which is normative; the comments below summarise it (see
// provisioner.proto for each method's rule), and docs/plugin-protocol.md
// adds the handshake, the lifecycle duties and the tests that keep them.
type Provisioner interface {
	// Info says what kind of provisioner this is and which contract it
	// speaks. It must work before Configure. An error means the plugin
	// is unusable.
	Info(context.Context, *InfoRequest) (*InfoResponse, error)

	// Schema describes the configuration the provisioner takes. It must
	// work before Configure and must not depend on the configuration.
	// An error means the plugin is unusable.
	Schema(context.Context, *SchemaRequest) (*SchemaResponse, error)

	// ValidateConfig checks a configuration without acting on it: no
	// network, no jobs, no files written. Problems come back as
	// diagnostics with a path into the configuration; an error means the
	// check itself could not run.
	ValidateConfig(context.Context, *ValidateConfigRequest) (*ValidateConfigResponse, error)

	// Configure validates and applies a configuration. It is called once,
	// before any of the methods below. Diagnostics of error severity mean
	// the provisioner stays unconfigured. A plugin that offers
	// CapabilityReconfigure takes it again, for a reload: the new
	// configuration replaces the old in place, or, refused, leaves it.
	Configure(context.Context, *ConfigureRequest) (*ConfigureResponse, error)

	// Shapes lists the sizes of machine the provisioner can start,
	// smallest first: the order the engine matches needs in.
	Shapes(context.Context, *ShapesRequest) (*ShapesResponse, error)

	// Covers says whether a machine the provisioner could start would fit
	// the need. It never asks for anything.
	//
	// Deprecated: no host calls Covers; the engine answers it from the
	// cached Shapes. It stays in the interface so that no plugin breaks;
	// a new plugin may return ErrUnimplemented (see provisioner.proto).
	Covers(context.Context, *CoversRequest) (*CoversResponse, error)

	// Provision tells the provisioner the engine's whole demand on it:
	// how many machines of each need it wants now. The provisioner asks
	// for the difference between that and what it already has on the way,
	// within its caps, and may cancel what is still pending beyond it.
	// Demand is level-triggered: the same demand twice asks for nothing
	// new. Provision returns at once: machines arrive later, by their
	// workers attaching to the engine. The response says, need by need,
	// what was done.
	Provision(context.Context, *ProvisionRequest) (*ProvisionResponse, error)

	// Reconcile forgets requests whose worker has attached and gives up on
	// (and cancels) those that have taken too long. It is idempotent.
	Reconcile(context.Context, *ReconcileRequest) (*ReconcileResponse, error)

	// Status says what the provisioner is called, what is outstanding and
	// what last went wrong. It never blocks on the cluster.
	Status(context.Context, *StatusRequest) (*StatusResponse, error)

	// Shutdown cancels whatever is outstanding, including requests in
	// flight, and returns by the request's deadline. Afterwards Provision
	// fails with ErrShutdown.
	Shutdown(context.Context, *ShutdownRequest) (*ShutdownResponse, error)
}

// Checker is a Provisioner that can check a configuration against the
// real system it names before anything is asked of it: a preflight, as
// Terraform's plan or a dry run is. It is optional: the host type-asserts
// for it, and over the wire a plugin without it answers ErrUnimplemented.
//
// A check is read-only and bounded: it may log in, read versions and
// limits, and ask a scheduler whether it would accept a job (sbatch
// --test-only), but it asks for nothing, starts nothing that outlives it,
// and returns by the context's deadline. It does not need Configure and
// does not configure.
type Checker interface {
	Check(context.Context, *CheckRequest) (*CheckResponse, error)
}

// Previewer is a Provisioner that can show what it would submit for one
// profile, such as the batch script, without submitting it or touching
// the network. Optional, like Checker.
type Previewer interface {
	Preview(context.Context, *PreviewRequest) (*PreviewResponse, error)
}

// CheckRequest carries a configuration to check against the real system.
type CheckRequest struct {
	// Name, Config and EngineID are as in ConfigureRequest.
	Name     string
	Config   json.RawMessage
	EngineID string
	// Probe (contract 2.7, CapabilityReachProbe) asks for the reach
	// probe: one short job whose worker asks the engine's URL, from a
	// compute node, whether it is reachable there. It is the only part
	// of a check that submits anything.
	Probe bool
}

// CheckResponse says what is wrong, if anything, and what was learned.
type CheckResponse struct {
	// Diagnostics point into the configuration, as ValidateConfig's do,
	// and quote the system's own words.
	Diagnostics Diagnostics
	// Facts are what the check learned that an operator should see
	// (versions, limits, where it logged in), in the order found.
	Facts []Fact
}

// Fact is one thing a check learned.
type Fact struct {
	Name, Value string
	// Path is where in the configuration it is about; nil for the
	// provisioner as a whole.
	Path []string
}

// PreviewRequest asks what would be submitted for a profile.
type PreviewRequest struct {
	Name    string
	Config  json.RawMessage
	Profile string
}

// PreviewResponse is what would be submitted. Text holds no credential:
// where one would be, there is a placeholder.
type PreviewResponse struct {
	Diagnostics Diagnostics
	Text        string
}

// Host is what a provisioner may ask of the engine that launched it. The
// SDK hands one to the plugin in ConfigureRequest.Host; over the wire it is
// a stream the host opens, so a plugin in any language can implement it.
type Host interface {
	// Publish reports something that happened. Events from one
	// provisioner reach the engine in the order they were published.
	Publish(context.Context, Event) error

	// MintCredential asks the engine to sign a credential for a worker.
	// The engine keeps the signing secret; it refuses names that do not
	// belong to the asking provisioner (ErrPermissionDenied) and may
	// shorten the TTL.
	MintCredential(context.Context, *MintCredentialRequest) (*MintCredentialResponse, error)
}

// BatchPublisher is a Host that sends many events back to back and then
// waits for their acknowledgements, instead of a round trip each. The
// events are the same messages, numbered and acknowledged in order as
// Publish's; only the waiting is pipelined, so it needs nothing of the
// other end and no contract version. The Go SDK's Host is one.
type BatchPublisher interface {
	PublishAll(context.Context, []Event) error
}

// PublishAll publishes evs in order: pipelined when h is a
// BatchPublisher, one Publish at a time otherwise. It returns the first
// error; events before it were delivered.
func PublishAll(ctx context.Context, h Host, evs []Event) error {
	if b, ok := h.(BatchPublisher); ok {
		return b.PublishAll(ctx, evs)
	}
	for _, ev := range evs {
		if err := h.Publish(ctx, ev); err != nil {
			return err
		}
	}
	return nil
}

// MaxMintBatch is the most credentials one batch mint may ask for. A
// thousand credentials are about half a megabyte on the wire, well within
// the host channel's message bound, and take the host a few milliseconds
// to sign; a larger burst is asked for in several batches.
const MaxMintBatch = 1000

// BatchMinter is a Host that mints many credentials in one round trip
// (contract 2.4, CapabilityBatchMint). Each item is guarded exactly as a
// MintCredential is, and answered on its own: one refused name does not
// refuse its neighbours. A batch of more than MaxMintBatch items, of
// none, or naming a worker twice is refused whole with
// ErrInvalidArgument. A credential is still worth one worker: the batch
// only saves the round trips.
//
// Call it through MintCredentials, which falls back to one MintCredential
// per item for a Host that is not a BatchMinter.
type BatchMinter interface {
	MintCredentials(context.Context, *MintCredentialsRequest) (*MintCredentialsResponse, error)
}

// MintCredentialsRequest asks for one credential per item.
type MintCredentialsRequest struct {
	Items []*MintCredentialRequest
}

// MintCredentialsResponse answers a MintCredentialsRequest: one result
// per item, in the same order.
type MintCredentialsResponse struct {
	Items []MintCredentialResult
}

// MintCredentialResult is one item's answer: a credential, or why not.
type MintCredentialResult struct {
	Credential *MintCredentialResponse
	Err        error
}

// MintCredentials mints one credential per item of req: in batches of at
// most MaxMintBatch when h is a BatchMinter, one call an item otherwise.
// An error means no answer for the whole (the host went away, ctx ended,
// the batch was refused); an item's refusal is in its result. Without an
// error the response has exactly one result per item, in order: a
// BatchMinter that answers another count is an error here, so that no
// caller has to check.
func MintCredentials(ctx context.Context, h Host, req *MintCredentialsRequest) (*MintCredentialsResponse, error) {
	out := &MintCredentialsResponse{Items: make([]MintCredentialResult, 0, len(req.Items))}
	if b, ok := h.(BatchMinter); ok {
		for i := 0; i < len(req.Items); i += MaxMintBatch {
			chunk := req.Items[i:min(i+MaxMintBatch, len(req.Items))]
			r, err := b.MintCredentials(ctx, &MintCredentialsRequest{Items: chunk})
			if err != nil {
				return nil, err
			}
			if len(r.Items) != len(chunk) {
				return nil, fmt.Errorf("asked for %d credentials, the host answered %d", len(chunk), len(r.Items))
			}
			out.Items = append(out.Items, r.Items...)
		}
		return out, nil
	}
	for _, item := range req.Items {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c, err := h.MintCredential(ctx, item)
		out.Items = append(out.Items, MintCredentialResult{Credential: c, Err: err})
	}
	return out, nil
}

// InfoRequest is empty; it exists so that it can grow.
type InfoRequest struct{}

// InfoResponse describes a provisioner plugin.
type InfoResponse struct {
	// Kind names the provisioner type, such as "slurm".
	Kind string
	// Version is the plugin's own version.
	Version string
	// ContractVersion is the ContractVersion the plugin was built with.
	ContractVersion string
	// Capabilities are what the plugin offers beyond the required
	// methods (CapabilityReconcileDelta); a host reads them with
	// HasCapability.
	Capabilities []Capability
}

// SchemaRequest is empty; it exists so that it can grow.
type SchemaRequest struct{}

// SchemaResponse carries the provisioner's configuration schema.
type SchemaResponse struct {
	Schema *Schema
}

// ValidateConfigRequest carries a configuration to check.
type ValidateConfigRequest struct {
	// Name is the provisioner's name from the host's configuration.
	Name string
	// Config is the configuration as a JSON object shaped by the schema:
	// attributes by name, blocks as lists of objects with their labels as
	// fields. Every attribute is present, defaults filled in.
	Config json.RawMessage
}

// ValidateConfigResponse lists what is wrong, if anything.
type ValidateConfigResponse struct {
	Diagnostics Diagnostics
}

// ConfigureRequest carries the configuration to apply.
type ConfigureRequest struct {
	// Name is the provisioner's name. Workers it starts must be named
	// with Name and a dash as prefix, or the host will not mint for them.
	Name string
	// Config is as in ValidateConfigRequest.
	Config json.RawMessage
	// EngineID names the engine, the same across its restarts. A plugin
	// marks what it creates outside the engine (Slurm jobs, VMs) with it,
	// and touches nothing that does not carry it: two engines may share
	// an account and even a provisioner name. Empty from an engine that
	// does not say; a plugin then falls back to Name.
	EngineID string
	// CredentialEpoch changes exactly when the engine's signing secret
	// does. Workers started under another epoch hold credentials the
	// engine no longer accepts, so a plugin cancels their jobs rather
	// than adopting them. It reveals nothing about the secret.
	CredentialEpoch string
	// EngineAddress is where the engine really listens, as network:address
	// ("tcp:127.0.0.1:8470", "unix:/run/engine.sock"), for a plugin that
	// carries its workers' connections to the engine itself (the Slurm
	// plugin's relay). It is not for workers to dial: a plugin's own
	// configuration says what they reach. Empty from an engine that does
	// not say.
	EngineAddress string
	// Host is the engine. On the plugin side the SDK sets it; a host
	// using Launch need not.
	Host Host
}

// ConfigureResponse lists what is wrong, if anything.
type ConfigureResponse struct {
	Diagnostics Diagnostics
}

// Need is what a node with nowhere to run needs of a machine. Zero RAMMB
// means no memory constraint; an empty Label means any machine.
type Need struct {
	CPUs  int
	GPUs  int
	RAMMB int64
	Label string
	// Lifetime (contract 2.8) is how long the machine must last once
	// its work starts: the engine sends a task's timeout plus the
	// worker's end margin. Zero means no constraint.
	Lifetime time.Duration
}

// LifetimeUnlimited is Shape.LifetimeFrom for a machine whose job has no
// time limit.
const LifetimeUnlimited = "unlimited"

// Shape is one size of machine a provisioner can start.
type Shape struct {
	// Profile is the name of the profile that starts it.
	Profile string
	CPUs    int
	GPUs    int
	// RAMMB is the memory it has, 0 if the profile does not say.
	RAMMB int64
	// Labels are what a worker started this way advertises.
	Labels []string
	// Lifetime (contract 2.8) is how long a machine of this shape lasts:
	// its job's time limit, counted from the job's start. Zero when it
	// has none (LifetimeFrom is LifetimeUnlimited) or the plugin does not
	// say (LifetimeFrom is empty: unknown, taken as unlimited).
	Lifetime time.Duration
	// LifetimeFrom says where Lifetime comes from, in words for people:
	// "--time=00:05:00", "partition debug's DefaultTime=00:02:00",
	// LifetimeUnlimited; empty when the plugin does not say.
	LifetimeFrom string
}

// Fits reports whether a machine of this shape meets the need: at least
// as many CPUs and GPUs, enough memory where both sides say, the label
// among its labels or equal to its profile name, and a lifetime at least
// the need's where both sides say.
func (s Shape) Fits(n Need) bool {
	if n.Label != "" && !s.HasLabel(n.Label) {
		return false
	}
	if s.CPUs < n.CPUs || s.GPUs < n.GPUs {
		return false
	}
	if n.Lifetime > 0 && s.Lifetime > 0 && s.Lifetime < n.Lifetime {
		return false
	}
	return n.RAMMB == 0 || s.RAMMB == 0 || s.RAMMB >= n.RAMMB
}

// HoldsResources is Fits without the lifetime: whether the machine is
// large enough for the need, however long it lasts.
func (s Shape) HoldsResources(n Need) bool {
	n.Lifetime = 0
	return s.Fits(n)
}

// HasLabel reports whether label is the shape's profile name or one of its
// labels.
func (s Shape) HasLabel(label string) bool {
	if label == s.Profile {
		return true
	}
	for _, l := range s.Labels {
		if l == label {
			return true
		}
	}
	return false
}

// ShapesRequest asks for the provisioner's shapes.
type ShapesRequest struct {
	// Label asks for the shapes that carry it; empty means every shape.
	//
	// Deprecated: hosts send it empty (see provisioner.proto). A plugin
	// still honours it, for an older caller.
	Label string
}

// ShapesResponse lists shapes, smallest first.
type ShapesResponse struct {
	Shapes []Shape
}

// CoversRequest asks whether a need could be met. Deprecated with
// Provisioner.Covers.
type CoversRequest struct {
	Need Need
}

// CoversResponse answers a CoversRequest.
type CoversResponse struct {
	Covered bool
	// Profile is the profile that would be asked for.
	Profile string
}

// ProvisionRequest is the engine's whole demand on one provisioner now.
type ProvisionRequest struct {
	// Demand lists what the engine wants machines for: Count machines
	// that fit Need, for each entry. It is everything the engine wants of
	// this provisioner that no idle worker serves, including what it asked
	// for before and is still waiting for; not an increment. An empty
	// Demand means nothing is wanted now.
	Demand []Demand
	// Attached names this provisioner's workers attached right now, as in
	// ReconcileRequest, so that a machine that has just arrived counts as
	// arrived, not as still on its way.
	Attached []string
}

// Demand is Count machines that fit Need.
type Demand struct {
	Need  Need
	Count int
}

// ProvisionOutcome says what a Provision call did.
type ProvisionOutcome int

const (
	// OutcomeRequested: this call asked for machines for the need.
	OutcomeRequested ProvisionOutcome = iota + 1
	// OutcomeOutstanding: enough machines for the need are already on
	// their way (or a submission for its profile is in flight, and the
	// rest will be asked for when it ends).
	OutcomeOutstanding
	// OutcomeNoFit: no profile fits the need.
	OutcomeNoFit
	// OutcomeBackingOff: recent submissions failed; asking again later.
	OutcomeBackingOff
	// OutcomeCapped: something other than failures holds the profile
	// below the demand: a cap of the configuration, a limit of the
	// system's, a person who must act. Condition says which, Detail in
	// words.
	OutcomeCapped
)

func (o ProvisionOutcome) String() string {
	switch o {
	case OutcomeRequested:
		return "requested"
	case OutcomeOutstanding:
		return "outstanding"
	case OutcomeNoFit:
		return "no_fit"
	case OutcomeBackingOff:
		return "backing_off"
	case OutcomeCapped:
		return "capped"
	}
	return "unknown"
}

// ProvisionResponse says what a Provision call did.
type ProvisionResponse struct {
	// Outcomes answers the request's Demand entry by entry, in order.
	Outcomes []DemandOutcome
	// Profiles says, for each profile the demand reached, where its
	// machines stand after this call.
	Profiles []ProfileDemand
}

// DemandOutcome is what Provision did about one Demand entry.
type DemandOutcome struct {
	Outcome ProvisionOutcome
	// Profile is the profile the need maps to, empty with OutcomeNoFit.
	Profile string
	// Detail says why, for anything but OutcomeRequested.
	Detail string
	// Condition says what holds the need back, with OutcomeCapped and
	// OutcomeBackingOff (contract 2.5); ConditionNone otherwise, and
	// from an older plugin, whose outcome is then read alone.
	Condition Condition
}

// Condition is what holds a need below the demand: a cap, weather, or a
// person who must act. See provisioner.proto's Condition for each value.
type Condition int

const (
	// ConditionNone: nothing, or the plugin does not say.
	ConditionNone Condition = iota
	// ConditionCap: a cap of the provisioner's configuration.
	ConditionCap
	// ConditionSiteLimit: an accounting limit of the system's; weather.
	ConditionSiteLimit
	// ConditionThrottled: the system's submit throttle; weather.
	ConditionThrottled
	// ConditionClusterFull: the system takes no new job; weather.
	ConditionClusterFull
	// ConditionLoginNeeded: a person must log in before anything is
	// asked for.
	ConditionLoginNeeded
	// ConditionBackingOff: the profile's machines failed in a row.
	ConditionBackingOff
	// ConditionMisconfigured: the profile's machines failed for its
	// configuration; a person must fix it.
	ConditionMisconfigured
)

func (c Condition) String() string {
	switch c {
	case ConditionNone:
		return "none"
	case ConditionCap:
		return "cap"
	case ConditionSiteLimit:
		return "site_limit"
	case ConditionThrottled:
		return "throttled"
	case ConditionClusterFull:
		return "cluster_full"
	case ConditionLoginNeeded:
		return "login_needed"
	case ConditionBackingOff:
		return "backing_off"
	case ConditionMisconfigured:
		return "misconfigured"
	}
	return "unknown"
}

// ProfileDemand is one profile's machines after a Provision call.
type ProfileDemand struct {
	Profile string
	// Wanted is the demand that maps to the profile, raised to its
	// min_workers.
	Wanted int
	// OnTheWay counts machines asked for whose worker has not attached:
	// pending in the queue, starting, or being submitted.
	OnTheWay int
	// Attached counts the profile's workers attached now.
	Attached int
	// Requested is how many machines this call asked for, in
	// Submissions submissions (sbatch calls, for Slurm).
	Requested, Submissions int
	// Cancelled is how many pending machines this call gave up because
	// the demand fell below what was on the way.
	Cancelled int
}

// ReconcileRequest carries the names of the workers attached right now:
// the whole list (Attached), or since contract 2.4 what changed since the
// last call this plugin process answered (Delta, Joined, Left).
//
// The engine sends a delta only to a plugin that offers
// CapabilityReconcileDelta, and the whole list on the first call to a
// plugin process, after a call that failed, and at least every minute
// (see provisioner.proto). Such a plugin keeps the set: Attached replaces
// it when Delta is false; otherwise Joined are added and Left removed.
type ReconcileRequest struct {
	Attached []string
	// Delta says Attached is empty and Joined and Left carry the change.
	Delta  bool
	Joined []string
	Left   []string
}

// ReconcileResponse says what Reconcile changed.
type ReconcileResponse struct {
	// Arrived lists workers whose requests were forgotten because they
	// attached.
	Arrived []string
	// Expired lists jobs given up on and cancelled.
	Expired []string
}

// StatusRequest is empty; it exists so that it can grow.
type StatusRequest struct{}

// StatusResponse is a provisioner's state.
type StatusResponse struct {
	Name        string
	Kind        string
	Profiles    []string
	Outstanding []Outstanding
	// LastError is the last thing that went wrong, empty if nothing has.
	LastError string
	// BackingOff lists profiles whose recent submissions failed and that
	// will not be asked for again until a time.
	BackingOff []Backoff
	// Counts says, per profile, where its machines stand and which
	// submissions made those still on their way.
	Counts []ProfileCounts
	// Notes are conditions an operator should know of that are not
	// errors, such as a cluster that refuses job arrays.
	Notes []string
	// Counters are the provisioner's own counts since its process
	// started, for the engine's metrics; nil if it keeps none. They
	// reset when the process restarts, as a Prometheus counter may.
	Counters *Counters
	// Runtime is the plugin process's heap and goroutines, read at this
	// call (contract 2.8); nil if the plugin does not say. A Go plugin
	// served with shared/plugin need not set it: the server fills it
	// with ReadRuntime on the way out.
	Runtime *Runtime
}

// Runtime is what a plugin's language runtime says of its own memory,
// for the engine's metrics (fluksio_plugin_heap_live_bytes and its
// neighbours): RSS cannot tell a leak from an allocator that keeps what
// it freed (the race detector's runtime keeps most of it), the live heap
// can. Optional in the contract: a plugin in another language fills what
// it has and leaves the rest 0, which the engine does not export.
type Runtime struct {
	// HeapLiveBytes is the heap the last garbage collection found
	// reachable (runtime/metrics' /gc/heap/live:bytes).
	HeapLiveBytes int64
	// HeapObjectsBytes is the heap's objects now, live and garbage not
	// yet collected (/memory/classes/heap/objects:bytes).
	HeapObjectsBytes int64
	// Goroutines is how many goroutines the process has
	// (/sched/goroutines:goroutines).
	Goroutines int64
}

// Counters are what only the provisioner can count: why its machines
// failed and how its calls to the cluster went. They ride on Status, so
// an engine needs no port and no scrape per plugin. Every label they
// give is bounded: profiles are the configuration's, classes are the
// five below, commands are the few the provisioner runs; never a job or
// a worker.
type Counters struct {
	Failures []FailureCount
	Commands []CommandStats
}

// FailureClass says why a machine asked for ended without a worker.
type FailureClass string

const (
	// FailureTransient: the request did not reach the cluster, or its
	// answer was lost, for a reason that may clear by itself (ssh down,
	// a timeout, the controller unreachable).
	FailureTransient FailureClass = "transient"
	// FailureMisconfigured: the cluster refused it as asked (sbatch
	// rejected the script, or the job pends for a reason waiting does
	// not clear): the configuration needs a person.
	FailureMisconfigured FailureClass = "misconfigured"
	// FailureDiedBeforeAttach: the job ran or ended before its worker
	// attached (the payload exited, the node failed).
	FailureDiedBeforeAttach FailureClass = "died_before_attach"
	// FailureTimedOut: the worker did not attach in time
	// (provision_timeout, attach_timeout).
	FailureTimedOut FailureClass = "timed_out"
	// FailureLimitReached: the cluster refused it for an accounting
	// limit of the user's (MaxSubmitJobs and the like) that clears as
	// jobs end, or held it up at a rate limit of the controller's until
	// it was cut off: weather, not a fault of the configuration.
	FailureLimitReached FailureClass = "limit_reached"
)

// FailureClasses are the classes a host shows; a class outside them is
// shown as "other".
var FailureClasses = []FailureClass{FailureTransient, FailureMisconfigured, FailureDiedBeforeAttach, FailureTimedOut, FailureLimitReached}

// FailureCount is how many machines of a profile failed for one class.
type FailureCount struct {
	Profile string
	Class   FailureClass
	Count   int64
}

// CommandStats is one kind of call to the cluster (for Slurm: sbatch,
// squeue, scancel, scontrol over ssh): how many, how they ended, and how
// long they took as a cumulative histogram.
type CommandStats struct {
	Command string
	// Calls counts every call; Errors those that ran and failed,
	// SSHErrors those the transport could not run (ssh exit 255), and
	// Timeouts those cut off by their deadline.
	Calls, Errors, SSHErrors, Timeouts int64
	// Rationed counts the calls that waited their turn at the
	// cluster's own rate limit (Slurm's per-user RPC rate limiter), and
	// answered late or ran out of their deadline for it: weather, not
	// errors. 0 from a provisioner that does not tell.
	Rationed int64
	// Buckets are the histogram's upper bounds in seconds, ascending,
	// and BucketCounts how many calls took at most each (cumulative).
	Buckets      []float64
	BucketCounts []int64
	// DurationSum is the calls' total time.
	DurationSum time.Duration
}

// ProfileCounts is one profile's machines.
type ProfileCounts struct {
	Profile string
	// Pending machines wait in the queue (or are being submitted);
	// Starting ones run and their worker has not attached yet; Attached
	// ones have a worker attached.
	Pending, Starting, Attached int
	// Submissions made the machines still on their way.
	Submissions []Submission
}

// Submission is one request to the cluster for one or more machines.
type Submission struct {
	// Job is the scheduler's id for it (an array job's id for a burst).
	Job string
	// Machines is how many machines it asked for, and OnTheWay how many
	// of them have not attached and are still wanted.
	Machines, OnTheWay int
	// Age is how long ago it was made.
	Age time.Duration
}

// Backoff is a profile waiting after failed submissions.
type Backoff struct {
	Profile string
	// Failures counts consecutive failed submissions.
	Failures int
	// Until is when the profile may be asked for again.
	Until     time.Time
	LastError string
}

// Outstanding is one request that has not yet arrived.
type Outstanding struct {
	Profile string
	// Job is the scheduler's id, empty while the submission is in flight.
	Job    string
	Worker string
	// Age is how long ago the request was made.
	Age time.Duration
	// State is the scheduler's view of the job, if the provisioner
	// knows it ("PENDING", "RUNNING").
	State string
	// Reason is why the scheduler holds a pending job, in its own word
	// (Slurm's "Priority", "Resources", "QOSMaxJobsPerUserLimit"); empty
	// when not pending or not known (contract 2.6).
	Reason string
}

// ShutdownRequest asks a provisioner to cancel what is outstanding.
type ShutdownRequest struct {
	// Deadline is when the host stops waiting. Zero means the context's
	// deadline, or none.
	Deadline time.Time
}

// ShutdownResponse says what Shutdown cancelled.
type ShutdownResponse struct {
	Cancelled []string
}

// MintCredentialRequest asks the engine for a worker credential. The
// credential binds the worker's name, the provisioner that asked (the host
// fills that in, whatever the plugin claims) and the machine the worker is
// meant to be: the engine lets a worker attach with at most these
// resources and only these labels. TTL should be the job's own lifetime
// (queue wait plus walltime); the host caps it.
type MintCredentialRequest struct {
	Worker string
	TTL    time.Duration
	// The shape of the profile the worker is started with. CPUs must be
	// at least 1: a credential for an unknown shape is refused.
	CPUs   int
	GPUs   int
	RAMMB  int64
	Labels []string
}

// MintCredentialResponse carries a credential. Token is a secret: never
// log it, never put it on a command line.
type MintCredentialResponse struct {
	Token   string
	Expires time.Time
}

// EventKind names something that happened to a request.
type EventKind string

const (
	// EventWorkerProvisioned: the scheduler accepted a request.
	EventWorkerProvisioned EventKind = "worker_provisioned"
	// EventWorkerProvisionFailed: a request could not be made, or its job
	// ended before the worker attached.
	EventWorkerProvisionFailed EventKind = "worker_provision_failed"
	// EventWorkerCancelled: a request was given up on and its job
	// cancelled.
	EventWorkerCancelled EventKind = "worker_cancelled"
	// EventWorkerJobEnded (contract 2.6): the job of an attached worker
	// ended, or left its machine, under the worker; JobState says how
	// and Detail why. The host drops the worker at once and revokes its
	// name, as for EventWorkerCancelled.
	EventWorkerJobEnded EventKind = "worker_job_ended"
)

// Event is something that happened to a request.
type Event struct {
	Kind        EventKind
	Provisioner string
	Profile     string
	Job         string
	Worker      string
	Time        time.Time
	Detail      string
	// Class says why, for EventWorkerProvisionFailed: one of
	// FailureClasses, so that an engine can tell weather (transient)
	// from a configuration a person must fix without reading Detail.
	// Empty from a plugin of a contract before 2.3, or when the plugin
	// cannot tell: unclassified, not transient.
	Class FailureClass
	// JobState is the scheduler's word for the job's state, for
	// EventWorkerJobEnded (FAILED, NODE_FAIL, ...).
	JobState string
	// Seq numbers the events of one plugin process from 1; the SDK sets
	// it so the host can tell a gap from a reorder.
	Seq uint64
}
