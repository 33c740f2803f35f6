package engine

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/internal/testutil"
)

// peerURLVar tells the test binary, started again as another user, to
// ask this URL and print each status (TestOperatorEndpointsOwnUserOnly).
const peerURLVar = "FLUKSIO_TEST_ENGINE_PEER_URL"

// operatorPaths are the kit's operator endpoints.
var operatorPaths = []string{"/status", "/v1/events", "/metrics"}

// TestOperatorEndpointsOwnUserOnly: with no auth function (Mux(nil, …)),
// the operator's endpoints answer the engine's own uid with 200 on IPv4,
// IPv6 and IPv4 through an IPv6 socket and on a unix socket, and uid
// 65534 (nobody, a real process started with syscall.Credential) with
// 403; opened with AllowAnyLocalUser, nobody gets 200. A connection
// whose other end is a plugin (here: this process, named as one) is
// refused too. Before, the kit served them to every local uid.
func TestOperatorEndpointsOwnUserOnly(t *testing.T) {
	if url := os.Getenv(peerURLVar); url != "" {
		// The other user's side: print each status, one a line.
		client := &http.Client{Timeout: 5 * time.Second}
		for _, path := range operatorPaths {
			resp, err := client.Get(url + path)
			if err != nil {
				fmt.Printf("%s error %v\n", path, err)
				continue
			}
			resp.Body.Close()
			fmt.Printf("%s %d\n", path, resp.StatusCode)
		}
		return
	}
	for _, listen := range []string{"127.0.0.1:0", "[::1]:0", ":0"} {
		for _, open := range []bool{false, true} {
			var protect func(http.Handler) http.Handler
			if open {
				protect = AllowAnyLocalUser
			}
			url := "http://" + serveKit(t, listen, protect)
			if listen == ":0" {
				_, port, _ := net.SplitHostPort(strings.TrimPrefix(url, "http://"))
				url = "http://127.0.0.1:" + port
			}
			got := getAll(t, &http.Client{Timeout: 5 * time.Second}, url)
			for _, path := range operatorPaths {
				if got[path] != http.StatusOK {
					t.Errorf("%s, open %v: GET %s as the engine's own uid: %d, want 200", listen, open, path, got[path])
				}
			}
			if os.Getuid() != 0 {
				t.Skip("asking as another uid needs root to start the process")
			}
			want := map[bool]int{false: 403, true: 200}[open]
			out := testutil.RunAsNobody(t, "TestOperatorEndpointsOwnUserOnly", peerURLVar+"="+url)
			for _, path := range operatorPaths {
				if !strings.Contains(out, fmt.Sprintf("%s %d\n", path, want)) {
					t.Errorf("%s, open %v: GET %s as uid 65534: want %d; the other user saw:\n%s", listen, open, path, want, out)
				}
			}
		}
	}

	// The unix socket: the engine's own uid through SO_PEERCRED.
	sock := filepath.Join(t.TempDir(), "e.sock")
	serveKit(t, "unix:"+sock, nil)
	unixClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	for path, code := range getAll(t, unixClient, "http://engine") {
		if code != http.StatusOK {
			t.Errorf("unix socket: GET %s as the engine's own uid: %d, want 200", path, code)
		}
	}

	// A plugin's connection, as a relaying plugin's, on loopback and on
	// the unix socket: refused.
	self := func() []int { return []int{os.Getpid()} }
	addr := serveKit(t, "127.0.0.1:0", ownUserOnly(self))
	for path, code := range getAll(t, &http.Client{Timeout: 5 * time.Second}, "http://"+addr) {
		if code != http.StatusForbidden {
			t.Errorf("from a plugin's process on loopback: GET %s: %d, want 403", path, code)
		}
	}
	sock = filepath.Join(t.TempDir(), "p.sock")
	serveKit(t, "unix:"+sock, ownUserOnly(self))
	for path, code := range getAll(t, unixClient, "http://engine") {
		if code != http.StatusForbidden {
			t.Errorf("from a plugin's process on the unix socket: GET %s: %d, want 403", path, code)
		}
	}
}

// serveKit runs an engine with no provisioners on listen, its operator's
// endpoints behind protect (nil: the kit's default), and returns its
// address.
func serveKit(t *testing.T, listen string, protect func(http.Handler) http.Handler) string {
	t.Helper()
	e, err := New(Config{Secret: testSecret, ID: "test", Listen: listen, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Stop(context.Background()) })
	if err := e.Serve(e.Mux(protect, false)); err != nil {
		t.Skipf("cannot listen on %s: %v", listen, err)
	}
	return e.Addr()
}

// getAll asks each operator path at base and returns the statuses.
func getAll(t *testing.T, client *http.Client, base string) map[string]int {
	t.Helper()
	got := map[string]int{}
	for _, path := range operatorPaths {
		resp, err := client.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s%s: %v", base, path, err)
		}
		resp.Body.Close()
		got[path] = resp.StatusCode
	}
	return got
}

// A loopback connection is told by its owner: this process holds the
// client end of a connection it opened, and init (pid 1) does not.
func TestPeerOwnedBy(t *testing.T) {
	remote, local := loopbackPair(t, "127.0.0.1:0")
	socks, err := peerSockets(remote, local)
	if err != nil || len(socks) != 1 {
		t.Fatalf("the peer of %s: %v, %v", remote, socks, err)
	}
	if !peerOwnedBy(socks, []int{os.Getpid()}) {
		t.Errorf("this process's own connection is not said to be its own")
	}
	if peerOwnedBy(socks, []int{1}) {
		t.Errorf("pid 1 said to own this process's connection")
	}
	if _, err := peerSockets("@", local); err == nil {
		t.Errorf("a unix socket's peer was judged")
	}
}

// The kernel's answer for one socket (netlink) is the one /proc/net/tcp
// gives: the client end's owner and inode, on IPv4, IPv6 and IPv4 through
// a socket listening on both.
func TestPeerSocketByNetlink(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:0", "[::1]:0", ":0"} {
		remote, local := loopbackPair(t, listen)
		rip, rport, err := splitIPPort(remote)
		if err != nil {
			t.Fatal(err)
		}
		lip, lport, err := splitIPPort(local)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := peerSocketByNetlink(rip, rport, lip, lport)
		if !ok {
			t.Fatalf("%s: netlink did not find the socket from %s to %s", listen, remote, local)
		}
		want, err := peerSocketsFromProc(rip, rport, lip, lport)
		if err != nil || len(want) != 1 {
			t.Fatalf("%s: /proc/net/tcp: %v, %v", listen, want, err)
		}
		if got != want[0] || got.uid != os.Getuid() {
			t.Errorf("%s: netlink says %+v, /proc/net/tcp %+v (this process's uid %d)", listen, got, want[0], os.Getuid())
		}
		// A port nobody uses is not found, and the caller reads /proc.
		if s, ok := peerSocketByNetlink(rip, 1, lip, lport); ok {
			t.Errorf("%s: netlink found a socket from port 1: %+v", listen, s)
		}
	}
}

// loopbackPair opens a connection to a listener on listen, both in this
// process, and returns the accepted end's remote and local addresses, as
// the engine sees a request's.
func loopbackPair(t *testing.T, listen string) (remote, local string) {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", listen, err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	dial := ln.Addr().String()
	if listen == ":0" {
		dial = fmt.Sprintf("127.0.0.1:%d", testutil.PortOf(t, dial))
	}
	client, err := net.Dial("tcp", dial)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server := <-accepted
	if server == nil {
		t.Fatal("no connection accepted")
	}
	t.Cleanup(func() { server.Close() })
	return server.RemoteAddr().String(), server.LocalAddr().String()
}
