package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// TestE2ESiblingCredentialUseless is the attack of issue 24, item 2, on
// the real Slurm: a burst of two is one job array, whose script holds
// both tasks' credentials. Task 1's prerun reads task 0's from "$0",
// waits until task 0 is attached, and tries it: GET /v1/work with no
// session and with a made-up one, POST /v1/result for the first tasks
// the engine hands out, POST /v1/detach, and an attach as task 0 with the
// real worker binary. Each is refused (401, 403, 409), and task 0 stays
// attached, gets its task and reports it.
func TestE2ESiblingCredentialUseless(t *testing.T) {
	e := newE2E(t, "e2e-sib")
	e.killPluginsAtEnd(t)
	dir, out := jobUserDir(t, "fluksio-sib-")
	url := fmt.Sprintf("http://127.0.0.1:%d", e.port)
	attack := filepath.Join(dir, "attack")
	// The credential is never printed: the test needs only the answers.
	script := `#!/bin/bash
# Task 1's prerun: task 0's credential, read from the job's own script.
out=` + out + `
url=` + url + `
tok=$(sed -n "s/^0) ` + shared.WorkerTokenEnv + `=\([^ ]*\) .*/\1/p" "$1" | tr -d "'")
if [ -z "$tok" ]; then echo "no credential for task 0 in $1" > $out/attack; exit 0; fi
code() { curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $tok" "$@"; }
# Before task 0 attaches, work answers 409 (not attached); after, 401.
for i in $(seq 1 600); do [ "$(code "$url/v1/work?wait=0")" != 409 ] && break; sleep 0.1; done
fake=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA
{
  echo "work $(code "$url/v1/work?wait=0")"
  echo "work-session $(code -H "Fluksio-Session: $fake" "$url/v1/work?wait=0")"
  for id in 1 2 3; do
    echo "result-$id $(code -H 'Content-Type: application/json' -d '{"task_id":"task-'$id'","output":"forged"}' "$url/v1/result")"
    echo "result-session-$id $(code -H "Fluksio-Session: $fake" -H 'Content-Type: application/json' -d '{"task_id":"task-'$id'","output":"forged"}' "$url/v1/result")"
  done
  echo "detach $(code -X POST "$url/v1/detach")"
  echo "detach-session $(code -X POST -H "Fluksio-Session: $fake" "$url/v1/detach")"
  ` + shared.WorkerTokenEnv + `=$tok SLURM_ARRAY_TASK_ID=0 ` + e.host + ` worker --url $url --cpus 1 --max-idle 5 > $out/attach.log 2>&1
  echo "attach-as-0 exit $?"
} > $out/attack.tmp
mv $out/attack.tmp $out/attack
`
	if err := os.WriteFile(attack, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := e.relConfig(t, "", `  profile "pair" {
    cpus   = 1
    ram_mb = 100
    sbatch = ["--partition=`+e.env.Partition+`", "--time=00:10:00"]
    prerun = ["[ \"$SLURM_ARRAY_TASK_ID\" != 1 ] || `+attack+` \"$0\""]
  }
`, e.host, "worker")
	// Each task works 20 s, so task 0 holds its task while task 1
	// attacks; the cpus=64 need fits no profile, so the engine runs on
	// until the test stops it.
	p := e.startEngine(t, "-config", cfg, "-need", "cpus=1,count=2,work=20s", "-need", "cpus=64", "-timeout", "4m")
	poll(t, 3*time.Minute, "task 1's prerun to attack", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		_, err := os.Stat(filepath.Join(out, "attack"))
		return err == nil
	})
	b, err := os.ReadFile(filepath.Join(out, "attack"))
	if err != nil {
		t.Fatal(err)
	}
	said := string(b)
	t.Logf("task 1's prerun with task 0's credential:\n%s", said)
	answers := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(said), "\n") {
		k, v, _ := strings.Cut(l, " ")
		answers[k] = v
	}
	want := map[string]string{"work": "401", "work-session": "403", "detach": "401", "detach-session": "403", "attach-as-0": "exit 1"}
	for id := 1; id <= 3; id++ {
		want[fmt.Sprintf("result-%d", id)] = "401"
		want[fmt.Sprintf("result-session-%d", id)] = "403"
	}
	for k, v := range want {
		if answers[k] != v {
			t.Errorf("%s: %q; want %s", k, answers[k], v)
		}
	}
	if log, _ := os.ReadFile(filepath.Join(out, "attach.log")); !strings.Contains(string(log), "already attached") {
		t.Errorf("the attach as task 0 said:\n%s\nwant already attached", log)
	}

	// Both tasks' work is done, each by its own worker, and no result
	// came from the prerun.
	poll(t, 2*time.Minute, "both tasks done", func() bool { return strings.Count(p.stdout.String(), "(simulated work)") >= 2 })
	story := p.stdout.String()
	done := regexp.MustCompile(`work done by (\S+): host \S+, job (\S+),`).FindAllStringSubmatch(story, -1)
	if len(done) != 2 || strings.Contains(story, "forged") {
		t.Errorf("results: %q; want two, none forged\n%s", done, story)
	}
	for _, m := range done {
		if _, task, _ := strings.Cut(m[2], "_"); !strings.HasSuffix(m[1], "-"+task) {
			t.Errorf("%s reported for job %s", m[1], m[2])
		}
	}
	if n := strings.Count(story, " attached from "); n != 2 {
		t.Errorf("%d attaches in the story; want the two tasks':\n%s", n, story)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.waitDone(t, 2*time.Minute)
	e.assertCleanedUp(t, time.Now())
}
