package relay

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
)

// Greeting starts the one line the relay writes on its standard
// output before the multiplexed session takes it over: the address
// workers dial.
const Greeting = "fluksio-relay "

// Usage is what the plugin binary's --help says of relay mode.
const Usage = `  provisioner-slurm relay [-listen HOST:PORT] [-host NAME] [-tls] [-private DIR]
                     the relay, as the plugin runs it on a login node
                     for reach = "relay"; not for running by hand either
`

// Main is the relay program: the plugin binary run on the login node
// as "provisioner-slurm relay -listen ADDR -host NAME". It listens where
// compute nodes can reach it, says where on its first line of standard
// output, and then carries every connection it accepts as a stream of a
// yamux session over its standard input and output, which is the ssh
// session the plugin holds. With -tls it first reads its certificate and
// key from standard input (Cert) and carries a connection only once
// its TLS handshake is done, as plaintext: a connection that is not TLS,
// or whose client does not accept the certificate, is closed unread. It
// dials nothing itself: where a stream goes
// is the plugin's business, and the plugin sends each to the engine and
// nowhere else. It exits when the session ends, that is when the plugin
// closes it or its ssh connection goes, so nothing of it outlives the
// plugin's hold on the login node.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", ":0", "`host:port` to listen on for workers")
	host := fs.String("host", "", "the `name` workers dial (default: this host's name)")
	useTLS := fs.Bool("tls", false, "serve workers TLS with the certificate and key read first from standard input")
	private := fs.String("private", "", "the private `directory` this binary was copied to and run from, removed once it runs")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return 0
	} else if err != nil {
		return 2
	}
	if *private != "" {
		// The copy is ours alone and already running: the kernel keeps
		// its file while the process lives, and nothing is left behind
		// when it ends, however it ends. Only this file and then the
		// directory, if empty: never a tree.
		if err := os.Remove(filepath.Join(*private, PrivateName)); err != nil {
			fmt.Fprintf(stderr, "fluksio-relay: removing the private copy: %v\n", err)
		} else if err := os.Remove(*private); err != nil {
			fmt.Fprintf(stderr, "fluksio-relay: removing the private directory: %v\n", err)
		}
	}
	if *host == "" {
		h, err := os.Hostname()
		if err != nil {
			fmt.Fprintf(stderr, "fluksio-relay: this host has no name to give workers (%v); pass -host\n", err)
			return 1
		}
		*host = h
	}
	// The certificate and key come first on standard input, never in
	// argv or a file: what crosses the session after them is yamux.
	in := bufio.NewReader(stdin)
	var tlsCfg *tls.Config
	if *useTLS {
		cert, err := readTLS(in)
		if err != nil {
			fmt.Fprintf(stderr, "fluksio-relay: reading the certificate from standard input: %v\n", err)
			return 1
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	ln, err := listenAgain(*listen, PortWait)
	if errors.Is(err, syscall.EADDRINUSE) {
		fmt.Fprintf(stderr, "fluksio-relay: %s: %v\n", PortTakenWords, err)
		return ExitPortTaken
	}
	if err != nil {
		fmt.Fprintf(stderr, "fluksio-relay: %v\n", err)
		return 1
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	if _, err := fmt.Fprintf(stdout, "%s%s\n", Greeting, net.JoinHostPort(*host, strconv.Itoa(port))); err != nil {
		return 1
	}
	sess, err := yamux.Client(Stdio{in, stdout}, YamuxConfig(stderr))
	if err != nil {
		fmt.Fprintf(stderr, "fluksio-relay: %v\n", err)
		return 1
	}
	defer sess.Close()

	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-sess.CloseChan()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if sess.IsClosed() || errors.Is(err, net.ErrClosed) {
				return 0
			}
			fmt.Fprintf(stderr, "fluksio-relay: accepting: %v\n", err)
			return 1
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if tlsCfg != nil {
				// Whoever cannot finish a handshake in time is not
				// a worker, and gets no stream.
				tc := tls.Server(c, tlsCfg)
				ctx, cancel := context.WithTimeout(context.Background(), HandshakeTimeout)
				err := tc.HandshakeContext(ctx)
				cancel()
				if err != nil {
					c.Close()
					return
				}
				c = tc
			}
			s, err := sess.OpenStream()
			if err != nil {
				c.Close()
				return
			}
			Splice(c, s)
		}()
	}
}

// PrivateName is the relay's name in its private directory; it starts
// like the cached file's name, so that ps shows what it is.
const PrivateName = "provisioner-slurm"

const (
	// tlsPrefix starts the line the plugin writes first on the
	// relay's standard input with -tls: the certificate and its key,
	// each DER in base64.
	tlsPrefix = "fluksio-relay-tls "

	// PortWait is how long a relay asked for a port keeps trying
	// to bind it: the relay it replaces may be a moment from exiting
	// (its ssh session just closed). Longer than that, the port is
	// somebody else's.
	PortWait = 5 * time.Second

	// HandshakeTimeout bounds a worker's TLS handshake with the
	// relay.
	HandshakeTimeout = 10 * time.Second

	// ExitPortTaken is the relay's exit code when the port it was asked
	// for stays taken; PortTakenWords is what it says.
	ExitPortTaken  = 92
	PortTakenWords = "the port asked for is taken"
)

// readTLS reads the line Cert.Line is.
func readTLS(in *bufio.Reader) (tls.Certificate, error) {
	line, err := in.ReadString('\n')
	if err != nil {
		return tls.Certificate{}, err
	}
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), tlsPrefix)
	certB64, keyB64, ok2 := strings.Cut(rest, " ")
	if !ok || !ok2 {
		return tls.Certificate{}, errors.New("not a certificate line")
	}
	certDER, err1 := base64.StdEncoding.DecodeString(certB64)
	keyDER, err2 := base64.StdEncoding.DecodeString(keyB64)
	if err := errors.Join(err1, err2); err != nil {
		return tls.Certificate{}, err
	}
	key, err := x509.ParsePKCS8PrivateKey(keyDER)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{certDER}, PrivateKey: key}, nil
}

// listenAgain listens on addr, trying again for up to wait while its
// port is in use: polling, since nothing tells a process when another
// lets go of a port.
func listenAgain(addr string, wait time.Duration) (net.Listener, error) {
	deadline := time.Now().Add(wait)
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return ln, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// YamuxConfig keeps the session alive and notices a dead one within
// half a minute: a relay whose plugin has gone must not linger.
func YamuxConfig(logs io.Writer) *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = true
	c.KeepAliveInterval = 10 * time.Second
	c.ConnectionWriteTimeout = 20 * time.Second
	c.LogOutput = logs
	// Each worker is one stream with a long poll or two in flight; the
	// default 256 KiB window is plenty for its small JSON bodies.
	return c
}

// Stdio is standard input and output as one connection for yamux.
type Stdio struct {
	io.Reader
	io.Writer
}

// Close closes both sides that can be closed.
func (s Stdio) Close() error {
	var errs []error
	if c, ok := s.Reader.(io.Closer); ok {
		errs = append(errs, c.Close())
	}
	if c, ok := s.Writer.(io.Closer); ok {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// Splice copies both ways between a and b until either side is done with
// it, then closes both.
func Splice(a, b io.ReadWriteCloser) {
	done := make(chan struct{}, 2)
	cp := func(dst io.Writer, src io.Reader) {
		io.Copy(dst, src)
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	a.Close()
	b.Close()
	<-done
}
