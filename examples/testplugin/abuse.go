package main

import (
	"context"
	"fmt"
	"os"
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
