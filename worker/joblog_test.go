package worker

import (
	"bytes"
	"log"
	"os"
	"path/filepath"
	"testing"

	"github.com/fluksio/provision/shared"
)

// TestRemoveJobLog: the job's log named by shared.JobLogEnv goes when
// it is a regular *.out file at an absolute path; a link named like one
// stays, and so does what it points to; another name, a relative path,
// a directory and nothing named are left and said; a file already gone
// is no error.
func TestRemoveJobLog(t *testing.T) {
	dir := t.TempDir()
	write := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("worker: attached\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	own := write("4242.out")
	target := write("keys.txt")
	link := filepath.Join(dir, "77_3.out")
	os.Symlink(target, link)
	other := write("4243.log")
	sub := filepath.Join(dir, "9.out")
	os.Mkdir(sub, 0o700)
	for _, c := range []struct {
		value string
		gone  string // the path that must be gone, if any
		stays string // the path that must stay, if any
		said  bool
	}{
		{value: own, gone: own},
		{value: own}, // gone already: silent
		{value: link, stays: target, said: true},
		{value: other, stays: other, said: true},
		{value: "4242.out", said: true},
		{value: sub, stays: sub, said: true},
		{value: ""},
	} {
		var logs bytes.Buffer
		removeJobLog(func(k string) string {
			if k == shared.JobLogEnv {
				return c.value
			}
			return ""
		}, log.New(&logs, "", 0))
		if c.gone != "" {
			if _, err := os.Lstat(c.gone); !os.IsNotExist(err) {
				t.Errorf("%s=%s: still there (%v); want it removed", shared.JobLogEnv, c.value, err)
			}
		}
		if c.stays != "" {
			if _, err := os.Lstat(c.stays); err != nil {
				t.Errorf("%s=%s: %s is gone (%v); want it left", shared.JobLogEnv, c.value, c.stays, err)
			}
		}
		if said := logs.Len() > 0; said != c.said {
			t.Errorf("%s=%q: said %q; want said %v", shared.JobLogEnv, c.value, logs.String(), c.said)
		}
	}
	if _, err := os.Lstat(link); err != nil {
		t.Errorf("the link named like a log was removed: %v", err)
	}
}
