package host

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"

	"github.com/hashicorp/go-plugin/runner"
)

// A plugin's stdout carries the handshake line and nothing else. What a
// plugin writes there afterwards reaches the host by one of two ways: a Go
// plugin's os.Stdout is go-plugin's stdio stream (ClientConfig.SyncStdout),
// and a plugin in another language, or one that writes to file descriptor
// 1 itself, writes to the pipe go-plugin read the handshake from, whose
// later lines go-plugin drops without a word. Both are handed to
// LaunchConfig.OnStdout, so that an operator (and the conformance checker)
// hears of them; go-plugin's runner is replaced only to see the second.

// cmdRunner is go-plugin's runner for a local process (its own is
// internal), with the plugin's stdout tapped after the handshake line.
type cmdRunner struct {
	cmd    *exec.Cmd
	stdout io.ReadCloser
	stderr io.ReadCloser
	pid    int
}

var _ runner.Runner = (*cmdRunner)(nil)

func newCmdRunner(cmd *exec.Cmd, onStdout func(string)) (*cmdRunner, error) {
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	tap := &lineWriter{onLine: onStdout, skip: 1}
	return &cmdRunner{cmd: cmd, stderr: safeStderr(stderr), stdout: struct {
		io.Reader
		io.Closer
	}{io.TeeReader(stdout, tap), stdout}}, nil
}

func (c *cmdRunner) Start(context.Context) error {
	if err := c.cmd.Start(); err != nil {
		return err
	}
	c.pid = c.cmd.Process.Pid
	return nil
}

func (c *cmdRunner) Wait(context.Context) error { return c.cmd.Wait() }

func (c *cmdRunner) Kill(context.Context) error {
	if c.cmd.Process == nil {
		return nil
	}
	if err := c.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

func (c *cmdRunner) Stdout() io.ReadCloser { return c.stdout }
func (c *cmdRunner) Stderr() io.ReadCloser { return c.stderr }
func (c *cmdRunner) Name() string          { return c.cmd.Path }
func (c *cmdRunner) ID() string            { return fmt.Sprint(c.pid) }

func (c *cmdRunner) Diagnose(context.Context) string {
	return "the plugin did not print go-plugin's handshake line first on stdout"
}

func (c *cmdRunner) PluginToHost(network, addr string) (string, string, error) {
	return network, addr, nil
}

func (c *cmdRunner) HostToPlugin(network, addr string) (string, string, error) {
	return network, addr, nil
}

// lineWriter hands each complete line written to it to onLine, after
// skipping the first skip lines (the handshake). A line is cut at
// maxTailLine bytes, so a plugin that writes megabytes without a newline
// costs the host nothing.
type lineWriter struct {
	onLine func(string)

	mu      sync.Mutex // guards skip and partial
	skip    int
	partial []byte
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	var lines []string
	for _, c := range b {
		if c == '\n' {
			if w.skip > 0 {
				w.skip--
			} else {
				lines = append(lines, string(w.partial))
			}
			w.partial = w.partial[:0]
			continue
		}
		if len(w.partial) < maxTailLine {
			w.partial = append(w.partial, c)
		}
	}
	w.mu.Unlock()
	// Outside the lock: onLine may log, and logging may block.
	for _, l := range lines {
		w.onLine(l)
	}
	return len(b), nil
}

// pluginLogBufferSize is go-plugin's default PluginLogBufferSize: the
// longest stderr line it parses as a whole.
const pluginLogBufferSize = 64 * 1024

// safeStderr is the plugin's stderr as go-plugin reads it: the same bytes
// in the same lines, except that a JSON line whose @message, @level or
// @timestamp is not a string has those turned into strings. go-plugin
// 1.8's parser asserts that they are strings, and a plugin that writes
// {"@message": 5} would panic the host's stderr reader and with it the
// host. Lines longer than go-plugin parses, and everything else, pass as
// they are. The copying goroutine ends when the plugin's stderr does.
func safeStderr(r io.ReadCloser) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		br := bufio.NewReaderSize(r, pluginLogBufferSize)
		continuation := false
		for {
			line, isPrefix, err := br.ReadLine()
			if err != nil {
				pw.CloseWithError(err)
				return
			}
			if !isPrefix && !continuation {
				line = safeLogLine(line)
			}
			if !isPrefix {
				line = append(line, '\n')
			}
			continuation = isPrefix
			if _, err := pw.Write(line); err != nil {
				r.Close()
				return
			}
		}
	}()
	return struct {
		io.Reader
		io.Closer
	}{pr, closers{pr, r}}
}

type closers []io.Closer

func (cs closers) Close() error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// safeLogLine returns line with hclog's special fields as strings.
func safeLogLine(line []byte) []byte {
	if len(line) == 0 || line[0] != '{' {
		return line
	}
	var special struct {
		Message   json.RawMessage `json:"@message"`
		Level     json.RawMessage `json:"@level"`
		Timestamp json.RawMessage `json:"@timestamp"`
	}
	if json.Unmarshal(line, &special) != nil {
		return line
	}
	ok := func(v json.RawMessage) bool { return len(v) == 0 || v[0] == '"' }
	if ok(special.Message) && ok(special.Level) && ok(special.Timestamp) {
		return line
	}
	var raw map[string]any
	if json.Unmarshal(line, &raw) != nil {
		return line
	}
	for _, k := range []string{"@message", "@level", "@timestamp"} {
		if v, present := raw[k]; present {
			if _, isString := v.(string); !isString {
				b, _ := json.Marshal(v)
				raw[k] = string(b)
			}
		}
	}
	fixed, err := json.Marshal(raw)
	if err != nil {
		return line
	}
	return fixed
}
