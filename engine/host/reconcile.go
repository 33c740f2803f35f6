package host

import (
	"slices"
	"time"

	"github.com/fluksio/provision/shared"
)

// DefaultReconcileResync is the longest a plugin that takes changes goes
// without hearing the whole attached list.
const DefaultReconcileResync = time.Minute

// AttachedTracker turns the engine's list of one provisioner's attached
// workers into what each Reconcile to one plugin process sends: the
// change since the last call the plugin answered, for a plugin that
// offers shared.CapabilityReconcileDelta, or the whole list.
//
// A plugin that holds many workers hears only the handful that changed;
// whenever the engine cannot be sure what the plugin holds it sends the
// whole list: on the first call to a plugin process (a restarted plugin
// is a new tracker), on the first after a call that failed or timed out,
// and at least every resync.
//
// It holds no lock: its caller (the engine's supervise.Supervisor) makes
// one Reconcile at a time per plugin process, and calls Request and
// Answered from that call.
type AttachedTracker struct {
	delta  bool
	resync time.Duration
	// sent is the sorted list the plugin holds, valid when synced.
	sent     []string
	synced   bool
	lastFull time.Time
	// pending is the list the last Request was made from.
	pending []string
}

// NewAttachedTracker is a tracker for a plugin process whose Info said
// info. resync bounds the time between whole lists; zero means
// DefaultReconcileResync.
func NewAttachedTracker(info *shared.InfoResponse, resync time.Duration) *AttachedTracker {
	if resync <= 0 {
		resync = DefaultReconcileResync
	}
	delta := shared.HasCapability(info.ContractVersion, info.Capabilities, shared.CapabilityReconcileDelta)
	return &AttachedTracker{delta: delta, resync: resync}
}

// Request is the ReconcileRequest for the workers attached now. attached
// is kept (not copied) until the next Request; it is sorted here if it is
// not already (the engine's books.attachedBy sorts).
func (t *AttachedTracker) Request(attached []string, now time.Time) *shared.ReconcileRequest {
	if !slices.IsSorted(attached) {
		attached = slices.Clone(attached)
		slices.Sort(attached)
	}
	t.pending = attached
	if !t.delta || !t.synced || now.Sub(t.lastFull) >= t.resync {
		return &shared.ReconcileRequest{Attached: attached}
	}
	req := &shared.ReconcileRequest{Delta: true}
	req.Joined, req.Left = diffSorted(t.sent, attached)
	return req
}

// Answered records how the call made with req ended: answered, the
// plugin holds the list req was made from; failed, nobody knows what it
// holds, so the next call carries the whole list.
func (t *AttachedTracker) Answered(req *shared.ReconcileRequest, ok bool, now time.Time) {
	if !ok {
		t.synced, t.sent = false, nil
		return
	}
	t.sent, t.synced = t.pending, true
	if !req.Delta {
		t.lastFull = now
	}
}

// diffSorted is what is in b and not in a (joined) and in a and not in b
// (left), for sorted a and b with no repeats.
func diffSorted(a, b []string) (joined, left []string) {
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		switch {
		case a[i] == b[j]:
			i++
			j++
		case a[i] < b[j]:
			left = append(left, a[i])
			i++
		default:
			joined = append(joined, b[j])
			j++
		}
	}
	left = append(left, a[i:]...)
	joined = append(joined, b[j:]...)
	return joined, left
}
