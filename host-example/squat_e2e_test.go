package main

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// squatPortEnv names the port the squatter takes: the test binary,
// re-executed as another user with it set, is the squatter.
const squatPortEnv = "FLUKSIO_SQUAT_PORT"

// squat is another user of the login node who wants the relay's port:
// it loops bind() on it until it has it, and then reads whatever the
// workers who dial it send, as a TLS server with a certificate of its own
// when they start with a handshake, in the clear when they do not. One
// line per connection says how many bytes it read, whether they began
// with a TLS handshake, and whether they held a bearer credential.
func squat(port string) int {
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	cert, err := squatterCert()
	if err != nil {
		say("squatter: %v", err)
		return 1
	}
	deadline := time.Now().Add(3 * time.Minute)
	var ln net.Listener
	for tries := 1; ; tries++ {
		if ln, err = net.Listen("tcp", ":"+port); err == nil {
			say("bound after %d tries", tries)
			break
		}
		if tries == 1 {
			say("the port is held; looping bind()")
		}
		if time.Now().After(deadline) {
			say("never bound: %v", err)
			return 1
		}
		// A loop as tight as an attacker's, yet sharing the machine.
		time.Sleep(time.Millisecond)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return 0
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(c)
			first, err := br.Peek(1)
			if err != nil {
				say("read 0 bytes")
				return
			}
			var r io.Reader = br
			hello := first[0] == 0x16
			if hello {
				tc := tls.Server(peeked{c, br}, &tls.Config{Certificates: []tls.Certificate{cert}})
				if err := tc.Handshake(); err != nil {
					say("read 0 bytes tls=true bearer=false handshake: %v", err)
					return
				}
				r = tc
			}
			b, _ := io.ReadAll(io.LimitReader(r, 1<<20))
			say("read %d bytes tls=%t bearer=%t", len(b), hello, bytes.Contains(b, []byte("Bearer")))
		}()
	}
}

// peeked is a connection whose first bytes were read into br.
type peeked struct {
	net.Conn
	br *bufio.Reader
}

func (p peeked) Read(b []byte) (int, error) { return p.br.Read(b) }

func squatterCert() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "not the relay"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// startSquatter runs the squatter as uid 65534 (nobody), another user of
// the login node, from a copy of the test binary it can execute. It is
// killed when the test ends.
func (e *e2e) startSquatter(t *testing.T, port string) (out *lockedBuffer) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(filepath.Dir(e.host), "squatter-"+e.name)
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(bin) })
	out = &lockedBuffer{}
	cmd := exec.Command(bin)
	cmd.Env = []string{squatPortEnv + "=" + port, "PATH=/usr/bin:/bin"}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	return out
}

// stolenCredential is a worker's credential as root reads it from the
// worker's environment, and the job it runs as.
type stolenCredential struct {
	token, job string
}

// workerCredentials reads the credentials of this test's running workers
// from their environments.
func (e *e2e) workerCredentials(t *testing.T) []stolenCredential {
	t.Helper()
	var out []stolenCredential
	files, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		env := map[string]string{}
		for _, kv := range strings.Split(string(b), "\x00") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				env[k] = v
			}
		}
		if env["SLURM_JOB_NAME"] != e.jobName() || env[shared.WorkerTokenEnv] == "" {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(f), "cmdline"))
		if !strings.Contains(string(cmdline), "worker") {
			continue
		}
		out = append(out, stolenCredential{token: env[shared.WorkerTokenEnv], job: worker.JobID(func(k string) string { return env[k] })})
	}
	return out
}

// TestE2ERelayPortSquatted is the attack on the relay's port: two workers
// work through the relay; another user of the login node (uid 65534)
// loops bind() on the relay's port, and the relay is killed. The squatter
// gets the port, and the workers, whose connections broke, dial it.
//
// What must hold: the squatter reads no credential (each connection is a
// TLS handshake it cannot complete: the workers pin the relay's
// certificate), the relay comes back on another port, the jobs that dial
// the old one leave the queue, their credentials are revoked (attaching
// with one read from a worker's environment is refused as revoked), the
// log says why, and the needs are still served, through the new relay.
// Before the relay spoke TLS the squatter read 18 requests with a bearer
// credential.
func TestE2ERelayPortSquatted(t *testing.T) {
	sandboxtest.RelayCache(t)
	e := newE2E(t, "e2e-relay-squat")
	e.killPluginsAtEnd(t)
	// The engine on TCP, so that a stolen credential can be tried on it;
	// the workers go through the relay.
	path := e.relayConfigOnTCP(t)
	p := e.startEngine(t, "-config", path, "-need", "cpus=1,count=2,work=40s", "-timeout", "4m")
	poll(t, 2*time.Minute, "two workers attached through the relay", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		return strings.Count(p.stdout.String(), " attached from ") == 2
	})
	addrRE := regexp.MustCompile(`the relay is up:.*workers_dial=(\S+)`)
	first := addrRE.FindStringSubmatch(p.stderr.String())
	if first == nil {
		t.Fatalf("the log does not say where the relay listens:\n%s", p.stderr)
	}
	_, port, err := net.SplitHostPort(first[1])
	if err != nil {
		t.Fatal(err)
	}
	stolen := e.workerCredentials(t)
	if len(stolen) != 2 {
		t.Fatalf("read %d workers' credentials, want 2", len(stolen))
	}
	before := map[string]bool{}
	for _, c := range stolen {
		before[c.job] = true
	}

	sq := e.startSquatter(t, port)
	// As the attack: the squatter is already looping when the relay
	// goes.
	poll(t, 30*time.Second, "the squatter looping bind() on the relay's port", func() bool { return strings.Contains(sq.String(), "looping bind()") })
	relays := relayProcesses(t)
	if len(relays) != 1 {
		t.Fatalf("relay processes %v, want one", relays)
	}
	if err := syscall.Kill(relays[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "the squatter holding the relay's port", func() bool { return strings.Contains(sq.String(), "bound after") })
	t.Logf("the squatter: %s", regexp.MustCompile(`bound after \d+ tries`).FindString(sq.String()))
	poll(t, 90*time.Second, "the relay up again, on another port", func() bool {
		all := addrRE.FindAllStringSubmatch(p.stderr.String(), -1)
		return len(all) >= 2 && all[len(all)-1][1] != first[1]
	})
	poll(t, 90*time.Second, "the jobs that dial the old port gone from the queue", func() bool {
		for _, line := range strings.Split(e.queue(t), "\n") {
			if f := strings.Fields(line); len(f) > 0 && before[f[0]] {
				return false
			}
		}
		return true
	})
	if !strings.Contains(p.stderr.String(), "the relay could not get its port back") {
		t.Errorf("the log does not say why the jobs were cancelled:\n%s", p.stderr)
	}
	// Revoked: attaching with a stolen credential, as its own job, is
	// refused as revoked.
	for _, c := range stolen {
		body := fmt.Sprintf(`{"hostname":"squatter","job_id":%q,"cpus":1,"gpus":0,"ram_mb":100,"labels":[]}`, c.job)
		req, _ := http.NewRequest("POST", "http://127.0.0.1:"+strconv.Itoa(e.port)+"/v1/attach", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(msg), "revoked") {
			t.Errorf("attaching with job %s's credential after its job was cancelled: %d %s; want 401, revoked", c.job, resp.StatusCode, msg)
		}
	}

	code := p.wait(t, 4*time.Minute)
	exitedAt := time.Now()
	t.Logf("story:\n%s", p.stdout)
	// What the squatter read, connection by connection.
	seen := sq.String()
	t.Logf("the squatter:\n%s", seen)
	conns := regexp.MustCompile(`(?m)^read (\d+) bytes tls=(\w+) bearer=(\w+)`).FindAllStringSubmatch(seen, -1)
	var bearer, plain int
	for _, m := range conns {
		if m[3] == "true" {
			bearer++
		}
		if m[2] != "true" {
			plain++
		}
	}
	if bearer != 0 || plain != 0 {
		t.Errorf("the squatter read %d connections with a bearer credential, %d not TLS, of %d; want none", bearer, plain, len(conns))
	}
	if len(conns) == 0 {
		t.Errorf("no worker dialled the squatter: the test shows nothing")
	}
	if code != 0 || !strings.Contains(p.stdout.String(), "all 2 need(s) served") {
		t.Fatalf("exit %d, want 0 with both needs served through the new relay\nstderr:\n%s", code, p.stderr)
	}
	e.assertCleanedUp(t, exitedAt)
	poll(t, 30*time.Second, "no relay process left on the login node", func() bool { return len(relayProcesses(t)) == 0 })
}
