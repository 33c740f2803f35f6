package relay

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/fluksio/provision/internal/testutil"
)

// TestMainTLSAndPort runs the relay in process. With -tls it reads
// its certificate from standard input, and a connection to it is carried
// as a stream only once the client has finished a TLS handshake, which
// a client that pins its certificate does and a plain one cannot: the
// plain client's bytes never reach a stream. Asked for a port somebody
// holds, it tries for PortWait and exits ExitPortTaken, saying so.
func TestMainTLSAndPort(t *testing.T) {
	cert, err := NewCert("127.0.0.1", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	var stderr testutil.Buffer
	exited := make(chan int, 1)
	go func() {
		exited <- Main([]string{"-listen", "127.0.0.1:0", "-host", "127.0.0.1", "-tls"}, inR, outW, &stderr)
		outW.Close()
	}()
	if _, err := io.WriteString(inW, cert.Line); err != nil {
		t.Fatal(err)
	}
	out := bufio.NewReader(outR)
	greeting, err := out.ReadString('\n')
	if err != nil {
		t.Fatalf("greeting: %v (stderr %s)", err, stderr.String())
	}
	addr := strings.TrimSpace(strings.TrimPrefix(greeting, Greeting))
	sess, err := yamux.Server(Stdio{Reader: out, Writer: inW}, YamuxConfig(&stderr))
	if err != nil {
		t.Fatal(err)
	}
	streams := make(chan []byte, 4)
	go func() {
		for {
			s, err := sess.AcceptStream()
			if err != nil {
				close(streams)
				return
			}
			b := make([]byte, 64)
			n, _ := s.Read(b)
			s.Write([]byte("ok"))
			streams <- b[:n]
			s.Close()
		}
	}()

	// A plain client: its bytes go nowhere, and it is cut off.
	plain, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	plain.Write([]byte("POST /v1/attach HTTP/1.1\r\nAuthorization: Bearer secret\r\n\r\n"))
	plain.SetReadDeadline(time.Now().Add(HandshakeTimeout + 5*time.Second))
	if n, _ := io.Copy(io.Discard, plain); n > 0 {
		t.Errorf("the plain client got %d bytes back", n)
	}
	plain.Close()

	// A client that pins the relay's certificate gets through.
	want, _ := hex.DecodeString(cert.Pin)
	tc, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, VerifyConnection: func(cs tls.ConnectionState) error {
		if got := sha256.Sum256(cs.PeerCertificates[0].Raw); !bytes.Equal(got[:], want) {
			return fmt.Errorf("certificate %x, pinned %x", got, want)
		}
		return nil
	}})
	if err != nil {
		t.Fatalf("a client pinning the relay's certificate: %v", err)
	}
	tc.Write([]byte("Bearer through"))
	if b, err := io.ReadAll(tc); err != nil || string(b) != "ok" {
		t.Errorf("the pinned client got %q, %v", b, err)
	}
	tc.Close()
	if got := <-streams; string(got) != "Bearer through" {
		t.Errorf("the first stream carried %q; want the pinned client's bytes, and nothing of the plain one's", got)
	}
	sess.Close()
	inW.Close()
	if code := <-exited; code != 0 {
		t.Errorf("the relay exited %d when its session ended", code)
	}

	// Its port, held by somebody else.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var taken testutil.Buffer
	began := time.Now()
	code := Main([]string{"-listen", ln.Addr().String(), "-host", "127.0.0.1"}, strings.NewReader(""), io.Discard, &taken)
	if code != ExitPortTaken || !strings.Contains(taken.String(), PortTakenWords) || time.Since(began) < PortWait {
		t.Errorf("on a taken port: exit %d after %s, said %q; want %d after %s, saying %q", code, time.Since(began), taken.String(), ExitPortTaken, PortWait, PortTakenWords)
	}
}
