package slurm

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
)

// attack is a job output that prints a credential in some form, and the
// strings (the credential, the form it is printed in) no run of
// redactRun bytes of which may be quoted.
type attack struct {
	name  string
	text  string
	forms []string
}

// noiseBefore and noiseAfter surround each attack: lines a real job
// prints, which must still be quoted.
const (
	noiseBefore = "loading modules\n+ module load python/3.11 (default)\n"
	noiseAfter  = "\nfluksio-worker: cannot start: no such module\n"
)

// attacks are the forms the fourth attack run printed a credential in,
// and a few more: folded at every column from 1 to 80 across lines,
// backslash continuations, spaces and quoted shell pieces; percent-
// encoded; base64 in both alphabets, padded or not, at each of the
// three byte offsets, and wrapped as base64(1) wraps; hex as xxd -p and
// od print it; the signature alone, the payload alone, and the token
// cut by tail -c.
func attacks(tok string) []attack {
	var out []attack
	add := func(name, text string, forms ...string) {
		out = append(out, attack{name: name, text: noiseBefore + text + noiseAfter, forms: append([]string{tok}, forms...)})
	}
	fold := func(s string, col int, sep string) string {
		var parts []string
		for len(s) > col {
			parts = append(parts, s[:col])
			s = s[col:]
		}
		return strings.Join(append(parts, s), sep)
	}
	for col := 1; col <= 80; col++ {
		add(fmt.Sprintf("folded at %d", col), fold(tok, col, "\n"))
		add(fmt.Sprintf("continued at %d", col), "echo "+fold(tok, col, "\\\n"))
		add(fmt.Sprintf("spaced at %d", col), "token: "+fold(tok, col, " "))
		add(fmt.Sprintf("quoted at %d", col), `t="`+fold(tok, col, "\"\n\"")+`"`)
		add(fmt.Sprintf("crlf at %d", col), fold(tok, col, "\r\n"))
	}
	var pctUpper, pctLower strings.Builder
	for i := range len(tok) {
		fmt.Fprintf(&pctUpper, "%%%02X", tok[i])
		fmt.Fprintf(&pctLower, "%%%02x", tok[i])
	}
	add("percent-encoded, upper", "GET /?t="+pctUpper.String()+" HTTP/1.1", pctUpper.String())
	add("percent-encoded, lower", "curl 'http://e/?t="+pctLower.String()+"'", pctLower.String())
	add("percent-encoded, folded at 7", fold(pctUpper.String(), 7, "\n"), pctUpper.String())
	add("query-escaped", "url=http://e/?token%3D"+url.QueryEscape(tok), url.QueryEscape(tok))

	for _, enc := range []struct {
		name string
		enc  *base64.Encoding
	}{
		{"std", base64.StdEncoding}, {"std raw", base64.RawStdEncoding},
		{"url", base64.URLEncoding}, {"url raw", base64.RawURLEncoding},
	} {
		for offset := range 3 {
			prefix := "FLUKSIO_WORKER_TOKEN="[:19+offset] // 19, 20, 21 bytes: each offset mod 3
			plain := prefix + tok + "\nexec fluksio-worker\n"
			b64 := enc.enc.EncodeToString([]byte(plain))
			// The characters any of whose bits are the token's.
			touched := b64[8*len(prefix)/6 : (8*(len(prefix)+len(tok))+5)/6]
			add(fmt.Sprintf("base64 %s at offset %d", enc.name, offset), b64, touched)
			add(fmt.Sprintf("base64 %s at offset %d, wrapped at 76", enc.name, offset), fold(b64, 76, "\n"), touched)
			alone := enc.enc.EncodeToString([]byte(tok[offset:]))
			add(fmt.Sprintf("base64 %s of the token from byte %d", enc.name, offset), "x="+alone, alone)
			add(fmt.Sprintf("base64 %s at offset %d, percent-encoded", enc.name, offset), "?d="+url.QueryEscape(b64), touched)
		}
	}
	h := hex.EncodeToString([]byte(tok))
	add("hex", h, h)
	add("HEX", strings.ToUpper(h), strings.ToUpper(h))
	add("xxd -p", fold(h, 60, "\n"), h)
	add("od pairs", fold(h, 2, " "), h)

	payload, sig, _ := strings.Cut(tok, ".")
	add("the signature alone", "sig="+sig, sig)
	add("the signature, folded at 10", fold(sig, 10, "\n"), sig)
	add("the payload alone", "payload="+payload, payload)
	for cut := 1; cut < len(tok)-redactRun; cut += 7 {
		add(fmt.Sprintf("cut by tail -c at %d", cut), tok[cut:]+"\n"+tok[cut:])
	}
	return out
}

// views are the ways a reader could join what is quoted again: as it is,
// without whitespace, quotes, backslashes and lastLines' " | ", and that
// with percent escapes decoded.
func views(s string) []string {
	stripped := strings.Map(func(r rune) rune {
		if strings.ContainsRune(" \t\r\n|\\\"'", r) {
			return -1
		}
		return r
	}, s)
	decoded, err := url.PathUnescape(stripped)
	if err != nil {
		decoded = stripped
	}
	return []string{s, stripped, decoded}
}

// leaked returns the runs of redactRun bytes of forms found in out.
func leaked(out string, forms []string) []string {
	var runs []string
	vs := views(out)
	for _, f := range forms {
		for i := 0; i+redactRun <= len(f); i++ {
			w := f[i : i+redactRun]
			for _, v := range vs {
				if strings.Contains(v, w) {
					runs = append(runs, w)
					break
				}
			}
		}
	}
	return runs
}

// mintedToken is a credential as the engine mints it, for worker.
func mintedToken(t *testing.T, worker string) string {
	t.Helper()
	signer := host.NewSigner([]byte(strings.Repeat("k", host.MinSecretLen)))
	tok, _, err := signer.Sign(host.CredentialClaims{Worker: worker, Provisioner: "hpc", CPUs: 2, RAMMB: 4000}, 35*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestRedactorCoversEncodings: every attack text, through the redactor
// made with the job's credential and a sibling's, keeps no run of 8
// bytes of the credential or of the form it was printed in, and keeps
// the job's own lines. Before, 69-84 of a token's 89-92 runs got through.
func TestRedactorCoversEncodings(t *testing.T) {
	tok := mintedToken(t, "hpc-cpu-00001092")
	r := newRedactor([]string{mintedToken(t, "hpc-cpu-00001093"), tok})
	checked := 0
	for _, a := range attacks(tok) {
		got := r.scrub(a.text)
		if runs := leaked(got, a.forms); len(runs) > 0 {
			t.Errorf("%s: %d runs got through, such as %q:\n%s", a.name, len(runs), runs[0], got)
		}
		if !strings.Contains(got, "module load python/3.11 (default)") || !strings.Contains(got, "no such module") {
			t.Errorf("%s: the job's own lines were redacted too:\n%s", a.name, got)
		}
		checked++
	}
	t.Logf("%d attack texts of a %d-byte credential, none with a run of %d bytes left", checked, len(tok), redactRun)
}

// TestRedactorKeepsOrdinaryOutput: output that holds no credential comes
// out as it went in, however much it looks like base64 or hex.
func TestRedactorKeepsOrdinaryOutput(t *testing.T) {
	r := newRedactor([]string{mintedToken(t, "hpc-cpu-00001092")})
	for _, s := range []string{
		"sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		"aGVsbG8gd29ybGQ=  %41%42%43 \\\n module load python/3.11.4 and numpy.linalg",
		"\x1b[31m/usr/bin/env: 'fluksio-worker': No such file or directory\x1b[0m",
	} {
		if got := r.scrub(s); got != s {
			t.Errorf("scrub(%q) = %q", s, got)
		}
	}
}

// TestExplainRedactsEncodedCredentials runs the attack texts through the
// real path: the job's credential is minted with the engine's Signer and
// put in its script by a real submission; its output is a real file the
// explain script reads with tail -c in a real sh. No run of 8 bytes of
// the credential or of its printed form is in what explain quotes; and
// for the job failing, in its event, last_error and the log.
func TestExplainRedactsEncodedCredentials(t *testing.T) {
	h := newUnconfigured(t, "sbatch=ok,squeue=rows,sh=here")
	// The explain script goes to a real sh, as sshd hands the command
	// line to the login's shell, with an scontrol that knows the job
	// failed; everything else to the fake ssh. A process of the test
	// binary per attack text would take a minute.
	bin := t.TempDir()
	scontrol := "#!/bin/sh\nprintf 'JobId=%s JobName=fluksio-hpc\\n   JobState=FAILED Reason=NonZeroExitCode ExitCode=2:0\\n' \"$3\"\n"
	ssh := "#!/bin/sh\ncase \"$*\" in\n*'--- fluksio: output'*)\n  while [ \"$1\" != -- ]; do shift; done\n  shift 2\n" +
		"  PATH=" + bin + ":/usr/bin:/bin exec sh -c \"$*\" ;;\nesac\nexec " + os.Args[0] + " \"$@\"\n"
	for name, text := range map[string]string{"scontrol": scontrol, "ssh": ssh} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h.p.sshPath = filepath.Join(bin, "ssh")
	var tok string
	h.host.Token = func(worker string) string {
		tok = mintedToken(t, worker)
		return tok
	}
	h.configure(t, nil)
	h.fake.forget(t)
	ev := h.provisioned(t)
	if sb := h.fake.callsTo("sbatch"); len(sb) != 1 || !strings.Contains(sb[0].Stdin, tok) {
		t.Fatalf("the script does not hold the minted credential")
	}
	h.p.mu.Lock()
	secrets := h.p.requestOf("cpu").secrets
	h.p.mu.Unlock()
	prof, _ := h.p.settings().profile("cpu")

	var composite strings.Builder
	n := 0
	for _, a := range attacks(tok) {
		if strings.HasPrefix(a.name, "continued") || strings.HasPrefix(a.name, "spaced") || strings.HasPrefix(a.name, "quoted") || strings.HasPrefix(a.name, "crlf") {
			continue // the unit test covers these folds
		}
		composite.WriteString(a.text)
		if err := os.WriteFile(filepath.Join(h.fake.dir, ev.Job+".out"), []byte(a.text), 0o644); err != nil {
			t.Fatal(err)
		}
		got := h.p.files.explain(context.Background(), prof, ev.Job, secrets)
		if runs := leaked(got, a.forms); len(runs) > 0 {
			t.Errorf("%s: %d runs got through explain, such as %q:\n%s", a.name, len(runs), runs[0], got)
		}
		if !strings.Contains(got, "its last lines: ") || !strings.Contains(got, "no such module") {
			t.Errorf("%s: explain quoted %q; want the job's last lines", a.name, got)
		}
		n++
	}
	t.Logf("%d attack texts explained from a real file", n)

	// The job fails with its output's last lines base64 and a fold: the
	// event, last_error and the log quote them.
	b64 := base64.StdEncoding.EncodeToString([]byte("T=" + tok))
	last := "+ echo " + b64 + "\n" + tok[:40] + "\\\n" + tok[40:] + "\n" + noiseAfter
	if err := os.WriteFile(filepath.Join(h.fake.dir, ev.Job+".out"), []byte(composite.String()+last), 0o644); err != nil {
		t.Fatal(err)
	}
	h.fake.setRows(t, ev.Job+"|FAILED|NonZeroExitCode|2026-12-02T10:00:01|"+tagOf(ev.Worker))
	h.p.poll.once(context.Background())
	failed := waitEvents(t, h.host, 2)[1]
	if failed.Kind != shared.EventWorkerProvisionFailed || !strings.Contains(failed.Detail, "no such module") {
		t.Fatalf("event = %+v; want a failure quoting the output", failed)
	}
	forms := []string{tok, b64[4 : len(b64)-4]}
	for where, s := range map[string]string{"event": failed.Detail, "last_error": h.status(t).LastError, "log": h.logs.String()} {
		if runs := leaked(s, forms); len(runs) > 0 {
			t.Errorf("%s: %d runs got through, such as %q:\n%s", where, len(runs), runs[0], s)
		}
	}
}
