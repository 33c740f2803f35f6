package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/fluksio/provision/shared"
)

// A plugin is code of other people, and the host must hold whatever it
// sends. TESTPLUGIN_ABUSE makes this plugin send too much, for the host's
// tests (a comma list):
//
//	status  Status reports 200,000 outstanding machines
//	event   Configure publishes an event with 100 MB of detail
//	stderr  the plugin writes 100 MB to stderr as it starts
//	flood   Configure starts publishing TESTPLUGIN_FLOOD events (default
//	        1,000,000), well-formed and each about a worker of its own,
//	        then one worker_cancelled for "<name>-flood-end"
//	bigmint Provision asks for credentials of 2^30 cpus and gpus (see
//	        mintShape)
func abuse(what string) bool {
	return strings.Contains(","+os.Getenv("TESTPLUGIN_ABUSE")+",", ","+what+",")
}

func abusiveStatus(st *shared.StatusResponse) {
	for i := range 200_000 {
		st.Outstanding = append(st.Outstanding, shared.Outstanding{Profile: "small", Job: fmt.Sprint(i), Worker: fmt.Sprintf("w-small-%08x", i), State: "PENDING"})
	}
}

func abusiveEvent(host shared.Host) {
	host.Publish(context.Background(), shared.Event{Kind: "chatter", Detail: strings.Repeat("x", 100<<20)})
}

func abusiveStderr() {
	line := strings.Repeat("y", 1023) + "\n"
	for range 100 << 10 {
		os.Stderr.WriteString(line)
	}
}

// abusiveFlood publishes n events in batches of a thousand, as fast as the
// host acknowledges them, each about a worker of its own: by turns a
// machine provisioned (and never heard of again), one cancelled, one
// failed, of a profile named after it, and an event of a kind of its own,
// so that every structure the engine keeps by worker, profile or kind
// sees a new key with each.
func abusiveFlood(host shared.Host, name string) {
	n := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("TESTPLUGIN_FLOOD")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	batch := make([]shared.Event, 0, 1000)
	for i := range n {
		w := fmt.Sprintf("%s-small-f%07d", name, i)
		var ev shared.Event
		switch i % 4 {
		case 0:
			ev = shared.Event{Kind: shared.EventWorkerProvisioned, Profile: "small", Job: strconv.Itoa(i), Worker: w}
		case 1:
			ev = shared.Event{Kind: shared.EventWorkerCancelled, Profile: "small", Job: strconv.Itoa(i), Worker: w}
		case 2:
			ev = shared.Event{Kind: shared.EventWorkerProvisionFailed, Profile: fmt.Sprintf("p%07d", i), Worker: w,
				Class: shared.FailureDiedBeforeAttach, Detail: "the worker exited with status 1 before it attached"}
		case 3:
			ev = shared.Event{Kind: shared.EventKind(fmt.Sprintf("chatter_%07d", i)), Profile: "small", Worker: w}
		}
		batch = append(batch, ev)
		if len(batch) == cap(batch) || i == n-1 {
			if err := shared.PublishAll(ctx, host, batch); err != nil {
				return
			}
			batch = batch[:0]
		}
	}
	host.Publish(ctx, shared.Event{Kind: shared.EventWorkerCancelled, Worker: name + "-flood-end", Detail: "flood done"})
}

// mintShape is the shape Provision mints the ith credential of one call
// for: with bigmint, every other one (the first, the third…) is 2^30
// cpus and gpus, and the first two are asked for one at a time, the
// rest in one batch; otherwise the profile's own.
func mintShape(i int, s shared.Shape) (cpus, gpus int) {
	if abuse("bigmint") && i%2 == 0 {
		return 1 << 30, 1 << 30
	}
	return s.CPUs, s.GPUs
}
