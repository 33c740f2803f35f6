package slurm

import (
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
)

// TestRedactSecrets: what a job's output may say about its credentials,
// as set -x, cat "$0", an echo, a curl -v or a tail -c cut prints them,
// comes out of explain's quote as [redacted], and the rest as it was.
func TestRedactSecrets(t *testing.T) {
	signer := host.NewSigner([]byte(strings.Repeat("k", host.MinSecretLen)))
	real, _, err := signer.Sign(host.CredentialClaims{Worker: "hpc-cpu-1", Provisioner: "hpc", CPUs: 1}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	known := "tok-0123456789abcdef"
	for _, c := range []struct {
		in      string
		secrets []string
		want    string
	}{
		{"+ FLUKSIO_WORKER_TOKEN=" + known, nil, "+ FLUKSIO_WORKER_TOKEN=[redacted]"},
		{"+ FLUKSIO_WORKER_TOKEN='" + real + "'", nil, "+ FLUKSIO_WORKER_TOKEN='[redacted]'"},
		{"+ export FLUKSIO_WORKER_TOKEN_0=a1 FLUKSIO_WORKER_TOKEN_1=b2", nil, "+ export FLUKSIO_WORKER_TOKEN_0=[redacted] FLUKSIO_WORKER_TOKEN_1=[redacted]"},
		{"> Authorization: Bearer " + known, nil, "> Authorization: Bearer [redacted]"},
		{"my token is " + known + ", see", []string{known}, "my token is [redacted], see"},
		{"worker said " + real + " twice: " + real, nil, "worker said [redacted] twice: [redacted]"},
		{real[20:] + " cut by tail -c", nil, "[redacted] cut by tail -c"},
		{"1) FLUKSIO_WORKER_TOKEN=" + real + " exec fluksio-worker --url http://e:1 ;;", nil,
			"1) FLUKSIO_WORKER_TOKEN=[redacted] exec fluksio-worker --url http://e:1 ;;"},
		{"/usr/bin/env: 'fluksio-worker': No such file or directory", []string{known}, "/usr/bin/env: 'fluksio-worker': No such file or directory"},
		{"module load python/3.11.4 and numpy.linalg", nil, "module load python/3.11.4 and numpy.linalg"},
	} {
		if got := newRedactor(c.secrets).scrub(c.in); got != c.want {
			t.Errorf("scrub(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestQuoteTailDropsACutLine: tail -c 2048 may begin inside a credential,
// whose last bytes match no pattern; a full tail's first line is left
// out, a shorter one (the whole file) is quoted from its start.
func TestQuoteTailDropsACutLine(t *testing.T) {
	cut := "Xk3_9fQ2-LmZ8pR4tYw1" // the end of a signature, cut by tail -c
	rest := "\n+ exec fluksio-worker --url http://e:1\nfluksio-worker: cannot start\n"
	full := cut + strings.Repeat("y", tailBytes-len(cut)-len(rest)) + rest
	if len(full) != tailBytes {
		t.Fatalf("the test's tail is %d bytes", len(full))
	}
	if got := quoteTail(full, nil); strings.Contains(got, cut) || !strings.HasPrefix(got, "+ exec fluksio-worker") {
		t.Errorf("a full tail quoted as %q; want its cut first line left out", got)
	}
	if got := quoteTail(cut+rest, nil); !strings.HasPrefix(got, cut) {
		t.Errorf("a whole file quoted as %q; want it from its first line", got)
	}
}
