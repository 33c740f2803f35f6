package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
)

// The signing secret (engine.secret_env) and the operator's token
// (engine.operator_token_env) arrive in environment variables, and
// os.Unsetenv does not take them out of /proc/PID/environ, which a plugin
// of the same uid can read. So run, when either is set, writes both into
// a pipe and re-executes its own binary once without them, the pipe's
// read end inherited (handoffFDVar carries its number); the new image
// reads the values into memory (handedSecrets). Only main may re-exec
// (reexecAllowed); a test that calls runMain reads and unsets them.

// handoffFDVar names the variable that carries, across the re-exec, the
// number of the descriptor holding the secrets. Its value is a number,
// not a secret.
const handoffFDVar = "FLUKSIO_ENGINE_SECRETS_FD"

// reexecAllowed is set by main: only the engine's own process may
// replace its image.
var reexecAllowed bool

// handedSecrets holds the values read from the handoff descriptor, by
// variable name. Written once by receiveSecrets, before any goroutine of
// the engine starts; read after.
var handedSecrets map[string]string

// lookupSecret is os.LookupEnv for the secret variables: a value handed
// over by the re-exec first, then the environment.
func lookupSecret(name string) (string, bool) {
	if v, ok := handedSecrets[name]; ok {
		return v, true
	}
	return os.LookupEnv(name)
}

// forgetSecret removes name from the environment and from what was
// handed over, so nothing started later inherits or finds it.
func forgetSecret(name string) {
	delete(handedSecrets, name)
	os.Unsetenv(name)
}

// receiveSecrets reads the values the pre-exec engine handed over, if
// handoffFDVar is set, and closes the descriptor.
func receiveSecrets() error {
	v, ok := os.LookupEnv(handoffFDVar)
	if !ok {
		return nil
	}
	os.Unsetenv(handoffFDVar)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return fmt.Errorf("$%s is %q, not a descriptor this engine handed itself; unset it", handoffFDVar, v)
	}
	f := os.NewFile(uintptr(fd), "secrets")
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return fmt.Errorf("reading the secrets handed over on descriptor %d ($%s): %w", fd, handoffFDVar, err)
	}
	handedSecrets = map[string]string{}
	for rec := range bytes.SplitSeq(b, []byte{0}) {
		if name, value, ok := bytes.Cut(rec, []byte{'='}); ok {
			handedSecrets[string(name)] = string(value)
		}
	}
	return nil
}

// reexecWithoutSecrets replaces the process's image with its own binary,
// started again with the variables names removed from its environment and
// their values on an inherited pipe. It returns only on failure, or with
// nil when there is nothing to move (none of names set, or this image was
// already started this way).
func reexecWithoutSecrets(names []string) error {
	if !reexecAllowed || handedSecrets != nil {
		return nil
	}
	var payload []byte
	move := map[string]bool{}
	for _, n := range names {
		if v, ok := os.LookupEnv(n); ok && n != "" {
			payload = append(append(append(append(payload, n...), '='), v...), 0)
			move[n] = true
		}
	}
	if len(move) == 0 {
		return nil
	}
	env := []string{}
	for _, kv := range os.Environ() {
		name, _, _ := bytes.Cut([]byte(kv), []byte{'='})
		if !move[string(name)] && string(name) != handoffFDVar {
			env = append(env, kv)
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("moving the secrets out of the environment: %w", err)
	}
	defer r.Close()
	// A pipe holds 64 KiB before a write blocks; two values are far less
	// (environment strings are bounded by the kernel at 128 KiB each, so
	// refuse what would not fit rather than block).
	if len(payload) > 60<<10 {
		w.Close()
		return fmt.Errorf("the secret variables hold %d bytes; at most 60 KiB can be handed over", len(payload))
	}
	_, err = w.Write(payload)
	w.Close()
	if err != nil {
		return fmt.Errorf("moving the secrets out of the environment: %w", err)
	}
	// The read end must survive the exec: clear its close-on-exec flag.
	if _, _, errno := syscall.Syscall(syscall.SYS_FCNTL, r.Fd(), syscall.F_SETFD, 0); errno != 0 {
		return fmt.Errorf("moving the secrets out of the environment: fcntl: %w", errno)
	}
	env = append(env, handoffFDVar+"="+strconv.Itoa(int(r.Fd())))
	err = syscall.Exec("/proc/self/exe", os.Args, env)
	return fmt.Errorf("re-executing /proc/self/exe without the secrets in the environment: %w; the engine will not keep them in /proc/PID/environ, so it does not start", err)
}
