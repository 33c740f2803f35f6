package host

import (
	"bytes"
	"encoding/base64"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestSignVerifyRoundTrip(t *testing.T) {
	t.Parallel()
	s := NewSigner(testSecret)
	token, expires, err := s.Sign(claims("slurm-gpu-1a2b3c4d"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(expires); d <= 59*time.Minute || d > time.Hour {
		t.Errorf("expires in %s; want about an hour", d)
	}
	cred, err := s.Verify(token, time.Now())
	if err != nil || !reflect.DeepEqual(cred.CredentialClaims, claims("slurm-gpu-1a2b3c4d")) || !cred.Expires.Equal(expires) {
		t.Errorf("Verify = %+v, %v; want %+v, nil", cred, err, claims("slurm-gpu-1a2b3c4d"))
	}
	// No labels reads back as no labels.
	bare := CredentialClaims{Worker: "p-a-1", Provisioner: "p", CPUs: 1}
	token, _, err = s.Sign(bare, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if cred, err := s.Verify(token, time.Now()); err != nil || !reflect.DeepEqual(cred.CredentialClaims, bare) {
		t.Errorf("Verify = %+v, %v; want %+v", cred, err, bare)
	}
	// The same secret in another Signer (an engine restarted with
	// FLUKSIO_ENGINE_SECRET) accepts it too.
	if _, err := NewSigner(bytes.Clone(testSecret)).Verify(token, time.Now()); err != nil {
		t.Errorf("same secret, other Signer: %v", err)
	}
}

func TestVerifyExpiry(t *testing.T) {
	t.Parallel()
	s := NewSigner(testSecret)
	token, expires, err := s.Sign(claims("w"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Verify(token, expires.Add(-time.Second)); err != nil {
		t.Errorf("a second before expiry: %v", err)
	}
	for _, at := range []time.Time{expires, expires.Add(time.Hour)} {
		if _, err := s.Verify(token, at); !errors.Is(err, ErrCredentialExpired) {
			t.Errorf("at %s (expires %s): err = %v; want ErrCredentialExpired", at, expires, err)
		}
	}
}

// tamper re-encodes a token's payload with edit applied, keeping its MAC.
func tamper(t *testing.T, token string, edit func(string) string) string {
	t.Helper()
	p64, m64, _ := strings.Cut(token, ".")
	payload, err := base64.RawURLEncoding.DecodeString(p64)
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString([]byte(edit(string(payload)))) + "." + m64
}

func TestVerifyRefuses(t *testing.T) {
	t.Parallel()
	s := NewSigner(testSecret)
	good, _, err := s.Sign(claims("slurm-cpu-00000001"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := NewSigner(bytes.Repeat([]byte{7}, 32)).Sign(claims("slurm-cpu-00000001"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p64, m64, _ := strings.Cut(good, ".")

	tests := []struct {
		name  string
		token string
		want  error
	}{
		{"empty", "", ErrCredentialMalformed},
		{"no dot", p64, ErrCredentialMalformed},
		{"two dots", good + ".x", ErrCredentialMalformed},
		{"empty halves", ".", ErrCredentialMalformed},
		{"not base64", "!!!." + m64, ErrCredentialMalformed},
		{"short mac", p64 + "." + m64[:20], ErrCredentialMalformed},
		{"padded", p64 + "=." + m64, ErrCredentialMalformed},
		{"huge", strings.Repeat("a", maxTokenLen+1), ErrCredentialMalformed},
		{"forged mac", p64 + "." + base64.RawURLEncoding.EncodeToString(make([]byte, 32)), ErrCredentialForged},
		{"other secret", other, ErrCredentialForged},
		{"tampered name", tamper(t, good, func(p string) string {
			return strings.Replace(p, "slurm-cpu-00000001", "slurm-cpu-00000002", 1)
		}), ErrCredentialForged},
		{"tampered expiry", tamper(t, good, func(p string) string {
			return strings.Replace(p, "\n1", "\n9", 1)
		}), ErrCredentialForged},
		{"tampered gpus", tamper(t, good, func(p string) string {
			return strings.Replace(p, "\n1\n", "\n4096\n", 1)
		}), ErrCredentialForged},
		{"tampered provisioner", tamper(t, good, func(p string) string {
			return strings.Replace(p, "\nslurm\n", "\nother\n", 1)
		}), ErrCredentialForged},
		{"swapped halves", m64 + "." + p64, ErrCredentialMalformed},
	}
	for _, tc := range tests {
		cred, err := s.Verify(tc.token, time.Now())
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: Verify = %q, %v; want %v", tc.name, cred.Worker, err, tc.want)
		}
		if err != nil && tc.token != "" && strings.Contains(err.Error(), tc.token) {
			t.Errorf("%s: error %q contains the token", tc.name, err)
		}
	}
}

func TestSignRefuses(t *testing.T) {
	t.Parallel()
	s := NewSigner(testSecret)
	for _, name := range []string{"", "a b", "a\nb", "a\x00b", strings.Repeat("x", maxWorkerNameLen+1), "\xff"} {
		if _, _, err := s.Sign(claims(name), time.Hour); err == nil {
			t.Errorf("Sign(%q) succeeded", name)
		}
	}
	if _, _, err := s.Sign(claims("w"), 0); err == nil {
		t.Error("Sign with ttl 0 succeeded")
	}
	for _, c := range []CredentialClaims{
		{Worker: "w", Provisioner: "", CPUs: 1},
		{Worker: "w", Provisioner: "a\nb", CPUs: 1},
		{Worker: "w", Provisioner: "p", CPUs: 0},
		{Worker: "w", Provisioner: "p", CPUs: 1, GPUs: -1},
		{Worker: "w", Provisioner: "p", CPUs: 1, Labels: []string{"a,b"}},
	} {
		if _, _, err := s.Sign(c, time.Hour); err == nil {
			t.Errorf("Sign(%+v) succeeded", c)
		}
	}
}

func TestNewSignerShortSecretPanics(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Error("NewSigner accepted a 31-byte secret")
		}
	}()
	NewSigner(make([]byte, 31))
}

func FuzzVerify(f *testing.F) {
	// A fixed clock: the fuzzer's workers run this setup again, and a
	// token signed a second later would be another token.
	at := time.Unix(1_800_000_000, 0)
	s := NewSigner(testSecret)
	s.now = func() time.Time { return at }
	good, _, _ := s.Sign(claims("fuzz-worker"), time.Hour)
	for _, seed := range []string{good, "", ".", "a.b", good + ".", "djE.AAAA", strings.Repeat(".", 50)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, token string) {
		cred, err := s.Verify(token, at)
		if err == nil && token != good {
			t.Errorf("Verify accepted %q as %q", token, cred.Worker)
		}
		if err == nil && (checkWorkerName(cred.Worker) != nil || checkClaims(cred.CredentialClaims) != nil) {
			t.Errorf("Verify returned bad claims %+v", cred)
		}
	})
}

var secretTests = []struct {
	value string
	want  []byte // nil: an error
}{
	{strings.Repeat("ab", 32), bytes.Repeat([]byte{0xab}, 32)},
	{"  " + strings.Repeat("AB", 40) + "\n", bytes.Repeat([]byte{0xab}, 40)},
	{strings.Repeat("ab", 20), nil}, // hex, but only 20 bytes
	{"correct horse battery staple, and then some", []byte("correct horse battery staple, and then some")},
	{"too short to sign with", nil},
	{"", nil},
}

func TestParseSecret(t *testing.T) {
	t.Parallel()
	for _, tc := range secretTests {
		got, err := ParseSecret(tc.value)
		if tc.want == nil {
			if err == nil {
				t.Errorf("ParseSecret(%q) = %x; want an error", tc.value, got)
			} else if strings.Contains(err.Error(), strings.TrimSpace(tc.value)) && tc.value != "" {
				t.Errorf("ParseSecret(%q): error %q repeats the secret", tc.value, err)
			}
			continue
		}
		if err != nil || !bytes.Equal(got, tc.want) {
			t.Errorf("ParseSecret(%q) = %x, %v; want %x", tc.value, got, err, tc.want)
		}
	}
}

// Not parallel: t.Setenv.
func TestSecretFromEnv(t *testing.T) {
	const name = "FLUKSIO_TEST_SECRET"
	t.Setenv(name, "")
	if _, err := SecretFromEnv(name); err == nil {
		t.Error("SecretFromEnv with the variable unset succeeded")
	}
	t.Setenv(name, strings.Repeat("0f", 32))
	if secret, err := SecretFromEnv(name); err != nil || !bytes.Equal(secret, bytes.Repeat([]byte{0x0f}, 32)) {
		t.Errorf("SecretFromEnv set = %x, %v", secret, err)
	}
	t.Setenv(name, "short")
	if _, err := SecretFromEnv(name); err == nil || !strings.Contains(err.Error(), name) || strings.Contains(err.Error(), "short") {
		t.Errorf("SecretFromEnv with a short secret: %v; want an error naming %s and not the value", err, name)
	}
}

// testSecret is a fixed secret, so that failures reproduce.
var testSecret = bytes.Repeat([]byte("0123456789abcdef"), 2)

// claims are what a test credential for worker binds.
func claims(worker string) CredentialClaims {
	return CredentialClaims{Worker: worker, Provisioner: "slurm", CPUs: 4, GPUs: 1, RAMMB: 8000, Labels: []string{"gpu"}}
}
