package main

// Broken modes, for the conformance checker's own tests: each makes this
// plugin break one rule of docs/plugin-protocol.md the way a plugin in
// another language might, so that the test can see the checker fail it
// and name the check. TESTPLUGIN_BREAK is a comma list:
//
//	contract    Info reports contract version 1.0
//	details     errors cross as bare gRPC codes, without ErrorInfo
//	stdout      Configure writes a line to stdout (file descriptor 1)
//	sigterm     from Info on, SIGTERM is ignored
//	controller  the process stays after GRPCController.Shutdown, as one
//	            that does not serve the controller does until SIGKILL
//	cookie      the plugin expects another magic cookie value
//	badlog      Configure writes a JSON log line whose @message, @level
//	            and @timestamp are not strings to stderr
//	storm       every machine it starts fails at once (worker_provision_failed,
//	            died_before_attach) and is forgotten, so the next Provision
//	            asks again: a plugin that never backs off, as an author's
//	            first one with worker_command = ["/bin/false"]. With
//	            TESTPLUGIN_STORM_FILE set, only while that file exists.
//	            Status counts the machines started, per profile, as
//	            died_before_attach failures.
//	dies        after announcing the machines of a Provision, it reports
//	            each dead before it attached, as a worker that exits at
//	            once does (the profile backs off)
//	diagpath    ValidateConfig reports its error at the configuration's
//	            root, not at the attribute that is wrong
//
// A plugin of yours needs none of this.

import (
	"os"
	"os/signal"
	"strings"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fluksio/provision/shared"
)

func broken(what string) bool {
	return strings.Contains(","+os.Getenv("TESTPLUGIN_BREAK")+",", ","+what+",")
}

// bareError is err as a plugin that sets only the gRPC code sends it:
// the host then cannot tell "shut down" from "not configured".
func bareError(err error) error {
	if !broken("details") {
		return err
	}
	return status.Error(codes.FailedPrecondition, err.Error())
}

func brokenInfo(info *shared.InfoResponse) {
	if broken("contract") {
		info.ContractVersion = "1.0"
	}
	if broken("sigterm") {
		// Serve listens for SIGTERM before any call arrives; Ignore
		// undoes that.
		signal.Ignore(syscall.SIGTERM)
	}
}

func brokenConfigure() {
	if broken("badlog") {
		// File descriptor 2 itself, as a plugin in another language
		// writes its logs: os.Stderr is go-plugin's stdio stream here.
		os.NewFile(2, "stderr").WriteString(`{"@message":5,"@level":{"a":1},"@timestamp":7,"note":"hostile"}` + "\n")
	}
	if broken("stdout") {
		// Not os.Stdout, which go-plugin has swapped for its stdio
		// stream: the pipe the handshake went down, as a print() in
		// another language writes to.
		os.NewFile(1, "stdout").WriteString("configured!\n")
	}
}

// brokenCookie makes the plugin compare the host's cookie with another
// value, as a plugin with a typo in it does.
func brokenCookie() {
	if broken("cookie") {
		const key = "FLUKSIO_PROVISIONER_PLUGIN"
		os.Setenv(key, "not-"+os.Getenv(key))
	}
}

// stormEnv names the file whose existence makes the storm mode's machines
// fail; unset, they always do.
const stormEnv = "TESTPLUGIN_STORM_FILE"

// storming reports whether a machine started now fails at once.
func storming() bool {
	if !broken("storm") {
		return false
	}
	f := os.Getenv(stormEnv)
	if f == "" {
		return true
	}
	_, err := os.Stat(f)
	return err == nil
}
