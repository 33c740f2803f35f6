package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The transfers of a command task, each on the task's routes
// (/v1/work/ID/...): its inputs fetched before the command runs, its
// stdout and stderr sent while it runs, its outputs uploaded after it
// ends (docs/worker-protocol.md).

const (
	// logChunk bounds one request of a stream's bytes.
	logChunk = 1 << 20
	// firstChunk is a stream's buffer until the command fills it.
	firstChunk = 8 << 10
	// logEvery is how long a stream's bytes wait to be sent, at most,
	// while the command writes.
	logEvery = time.Second
	// stallAfter abandons a transfer that has moved no byte for this
	// long: an engine gone silent in the middle of a body would
	// otherwise hold the task for ever.
	stallAfter = 60 * time.Second
)

// Why the engine refused a transfer.
var (
	// errNotHolder is 409: the engine has no such task for this worker
	// now (it ended, or was cancelled and handed out again).
	errNotHolder = errors.New("the engine does not have this task for this worker")
	// errTooLarge is 413: past the engine's limit for the task.
	errTooLarge = errors.New("past the engine's limit")
	// errStalled ends a transfer that stopped moving (stallAfter).
	errStalled = fmt.Errorf("no byte moved for %s", stallAfter)
)

// taskPath is the path of one of task id's transfers: route ("inputs",
// "log", "outputs"), then name, each element escaped, "/" kept.
func taskPath(id, route, name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return "/v1/work/" + url.PathEscape(id) + "/" + route + "/" + strings.Join(parts, "/")
}

// transfer makes one request of a task's transfers, retrying as call
// does while the engine is unreachable or unavailable; body (nil: none)
// gives each try its body and its size afresh. It returns a 2xx answer,
// whose body the caller reads and closes; any other answer is an error:
// errNotHolder, errTooLarge, errRefused (401, 403), or the engine's
// message.
func (w *Client) transfer(ctx context.Context, method, path string, q url.Values, body func() (io.Reader, int64)) (*http.Response, error) {
	r := w.retrying()
	for {
		var (
			rd          io.Reader
			size        int64
			contentType string
		)
		if body != nil {
			rd, size = body()
			contentType = "application/octet-stream"
		}
		req, err := w.newRequest(ctx, method, path, q, rd, contentType)
		if err != nil {
			return nil, err
		}
		if body != nil {
			req.ContentLength = size
			if size == 0 {
				// Said by NoBody: a body of unknown length would go
				// chunked.
				if c, ok := rd.(io.Closer); ok {
					c.Close()
				}
				req.Body, req.GetBody = http.NoBody, nil
			}
		}
		resp, err := w.http.Do(req)
		if err == nil && resp.StatusCode >= 200 && resp.StatusCode < 300 {
			return resp, nil
		}
		if ctx.Err() != nil {
			if resp != nil {
				resp.Body.Close()
			}
			return nil, context.Cause(ctx)
		}
		if err == nil {
			data, _ := io.ReadAll(io.LimitReader(resp.Body, MaxRequestBody))
			resp.Body.Close()
			var answer ErrorResponse
			_ = json.Unmarshal(data, &answer)
			msg := answer.Error
			if msg == "" {
				msg = http.StatusText(resp.StatusCode)
			}
			switch status := resp.StatusCode; {
			case status == http.StatusConflict:
				return nil, fmt.Errorf("%w: %s", errNotHolder, msg)
			case status == http.StatusRequestEntityTooLarge:
				return nil, fmt.Errorf("%w: %s", errTooLarge, msg)
			case status == http.StatusUnauthorized || status == http.StatusForbidden:
				return nil, fmt.Errorf("%w: %s", errRefused, msg)
			case !unavailable(status):
				return nil, fmt.Errorf("%s %s: %d %s", method, path, status, msg)
			}
			err = fmt.Errorf("%d %s", resp.StatusCode, msg)
		} else if engineUnverified(err) {
			return nil, err
		}
		if err := r.again(ctx, method, path, err); err != nil {
			return nil, err
		}
	}
}

// stallGuard returns ctx ended with errStalled once no byte has moved
// for d, a wrapper that counts a reader's bytes as moving, and what
// releases the guard.
func stallGuard(ctx context.Context, d time.Duration) (context.Context, func(io.Reader) io.Reader, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	timer := time.AfterFunc(d, func() { cancel(errStalled) })
	moved := func(r io.Reader) io.Reader { return &progress{r: r, timer: timer, d: d} }
	return ctx, moved, func() {
		timer.Stop()
		cancel(nil)
	}
}

// progress resets a stall guard's timer with every byte read through it.
type progress struct {
	r     io.Reader
	timer *time.Timer
	d     time.Duration
}

func (p *progress) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.timer.Reset(p.d)
	}
	return n, err
}

// fetchInputs fetches t's inputs into dir, each checked against its size
// and digest; the first that cannot be fetched, or does not match, is
// the error.
func (w *Client) fetchInputs(ctx context.Context, t Task, dir string) error {
	for _, in := range t.Inputs {
		if err := w.fetchInput(ctx, t.ID, dir, in); err != nil {
			return err
		}
	}
	return nil
}

func (w *Client) fetchInput(ctx context.Context, id, dir string, in File) error {
	ctx, moved, release := stallGuard(ctx, stallAfter)
	defer release()
	resp, err := w.transfer(ctx, http.MethodGet, taskPath(id, "inputs", in.Name), nil, nil)
	if err != nil {
		return fmt.Errorf("could not fetch input %q: %w", in.Name, err)
	}
	defer resp.Body.Close()
	// The directory is fresh and the command has not run: nothing in it
	// is a symlink but what is made here, and names have no "..".
	dest := filepath.Join(dir, filepath.FromSlash(in.Name))
	if err := os.MkdirAll(filepath.Dir(dest), 0o700); err != nil {
		return fmt.Errorf("input %q: %w", in.Name, err)
	}
	f, err := os.OpenFile(dest, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("input %q: %w", in.Name, err)
	}
	h := sha256.New()
	// What comes past the size is digested, not written, so that the
	// error can name its digest; within reason (inputSlack).
	n, err := io.CopyBuffer(io.MultiWriter(&capped{w: f, left: in.Size}, h), io.LimitReader(moved(resp.Body), in.Size+inputSlack+1),
		make([]byte, min(in.Size+1, fetchBuffer)))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return fmt.Errorf("could not fetch input %q: %w", in.Name, err)
	}
	got := hex.EncodeToString(h.Sum(nil))
	if n > in.Size+inputSlack {
		return fmt.Errorf("input %q does not match the task: it came as more than %d bytes; the task says %d bytes with sha256 %s",
			in.Name, in.Size+inputSlack, in.Size, in.SHA256)
	}
	if n != in.Size || !strings.EqualFold(got, in.SHA256) {
		return fmt.Errorf("input %q does not match the task: it came as %d bytes with sha256 %s; the task says %d bytes with sha256 %s",
			in.Name, n, got, in.Size, in.SHA256)
	}
	return nil
}

// fetchBuffer bounds the buffer an input is copied through, from the
// connection to the file and the digest: a read takes what the
// connection has, up to it, and each is one write and one digest
// update. io.Copy's 32 KiB made up to eight times the calls; 1 MiB was no
// faster than this (bench, measurement 16).
const fetchBuffer = 256 << 10

// inputSlack is how far past its size an input is read, to name the
// digest of what came instead; past it, only that it is longer.
const inputSlack = 1 << 20

// capped writes its first left bytes to w and drops the rest.
type capped struct {
	w    io.Writer
	left int64
}

func (c *capped) Write(p []byte) (int, error) {
	keep := p[:min(int64(len(p)), c.left)]
	if _, err := c.w.Write(keep); err != nil {
		return 0, err
	}
	c.left -= int64(len(keep))
	return len(p), nil
}

// logStream is one of a command's streams as the worker sends it.
type logStream struct {
	name string   // StreamStdout or StreamStderr
	r    *os.File // the read end of the command's pipe
	// sent is how many bytes of it the engine has; the stream
	// goroutine's until it ends.
	sent int64
	// reading is set while the stream goroutine waits in Read, and got
	// counts the bytes it has read: drain tells by them a pipe held
	// open and idle from a stream still being sent.
	reading atomic.Bool
	got     atomic.Int64
}

// stream reads s until no process holds its pipe's other end, and sends
// it on as it comes: at most logChunk a request, and no byte waits more
// than logEvery. The worker stops sending after a stop that drops
// transfers, after a refusal, or at Limits.Log, which also stops the
// command (stopLogLimit); it reads on all the same, so that the command
// never blocks on a full pipe.
//
// Its buffer starts at firstChunk and doubles as the command fills it,
// up to logChunk: a command that writes little (or nothing, as most do)
// costs a small buffer, not two of logChunk zeroed for every task.
func (w *Client) stream(t Task, st *stopper, s *logStream) {
	buf := make([]byte, 0, firstChunk)
	var oldest time.Time // when buf's first byte came
	sending := true
	for {
		if len(buf) == cap(buf) && cap(buf) < logChunk {
			buf = append(make([]byte, 0, min(2*cap(buf), logChunk)), buf...)
		}
		var deadline time.Time
		if len(buf) > 0 {
			deadline = oldest.Add(logEvery)
		}
		// Pipes are pollable: a read deadline works on them.
		_ = s.r.SetReadDeadline(deadline)
		s.reading.Store(true)
		n, err := s.r.Read(buf[len(buf):cap(buf)])
		s.reading.Store(false)
		s.got.Add(int64(n))
		if n > 0 && len(buf) == 0 {
			oldest = time.Now()
		}
		buf = buf[:len(buf)+n]
		ended := err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
		if len(buf) > 0 && (ended || len(buf) == logChunk || !time.Now().Before(oldest.Add(logEvery))) {
			if sending {
				sending = w.sendLog(t, st, s, buf)
			}
			buf = buf[:0]
		}
		if ended {
			return
		}
	}
}

// sendLog sends chunk, the next bytes of s, within Limits.Log, and
// reports whether to go on sending s.
func (w *Client) sendLog(t Task, st *stopper, s *logStream, chunk []byte) bool {
	if reason, _ := st.why(); reason.dropsTransfers() {
		return false
	}
	limit := t.Limits.Log
	over := limit > 0 && s.sent+int64(len(chunk)) > limit
	if over {
		chunk = chunk[:limit-s.sent]
	}
	if len(chunk) > 0 {
		if err := w.postLog(st.transfers, t.ID, s, chunk); err != nil {
			switch {
			case st.transfers.Err() != nil:
				// Cancelled, or the worker is leaving: nothing more is sent.
			case errors.Is(err, errTooLarge):
				st.stop(stopLogLimit, fmt.Sprintf("%s beyond the engine's limit (%v)", s.name, err))
			default:
				st.stop(stopLost, fmt.Sprintf("could not send %s: %v", s.name, err))
			}
			return false
		}
	}
	if over {
		st.stop(stopLogLimit, fmt.Sprintf("%s beyond the engine's limit of %d bytes", s.name, limit))
		return false
	}
	return true
}

// postLog appends chunk to stream s of task id on the engine, at the
// offset of what it has; a repeat after a lost answer is answered as
// if appended, so a retry is safe.
func (w *Client) postLog(ctx context.Context, id string, s *logStream, chunk []byte) error {
	ctx, moved, release := stallGuard(ctx, stallAfter)
	defer release()
	q := url.Values{"offset": {strconv.FormatInt(s.sent, 10)}}
	resp, err := w.transfer(ctx, http.MethodPost, taskPath(id, "log", s.name), q, func() (io.Reader, int64) {
		return moved(bytes.NewReader(chunk)), int64(len(chunk))
	})
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, MaxRequestBody))
	resp.Body.Close()
	want := s.sent + int64(len(chunk))
	if h := resp.Header.Get(OffsetHeader); h != "" {
		if got, err := strconv.ParseInt(h, 10, 64); err != nil || got != want {
			return fmt.Errorf("the engine has %s bytes of %s; the worker has sent %d", h, s.name, want)
		}
	}
	s.sent = want
	return nil
}

// outputFile is a file to upload: its name on the wire (an output's
// name, or a path under an output that is a directory) and on the node.
type outputFile struct {
	name, path string
	size       int64
}

// uploadOutputs uploads t's outputs from dir after its command has
// ended, a directory's file by file. It returns what was uploaded; notes
// on outputs that were not there; and the first reason an output could
// not be uploaded: a symlink, a path that resolves outside dir, a file
// that is not a regular one, or the outputs together past
// Limits.Outputs, in which case none is sent.
func (w *Client) uploadOutputs(ctx context.Context, t Task, dir string) ([]File, []string, error) {
	files, notes, err := collectOutputs(t.Outputs, dir)
	if err != nil {
		return nil, notes, err
	}
	// What the engine makes of them: each file, and each directory the
	// names lie in, which also counts DirBytes against the bytes.
	var total int64
	dirs := map[string]bool{}
	for _, f := range files {
		total += f.size
		for d := path.Dir(f.name); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	total += int64(len(dirs)) * DirBytes
	if limit := t.Limits.Outputs; limit > 0 && total > limit {
		return nil, notes, fmt.Errorf("outputs beyond the engine's limit of %d bytes: they come to %d", limit, total)
	}
	if limit, n := t.Limits.Files, int64(len(files)+len(dirs)); limit > 0 && n > limit {
		return nil, notes, fmt.Errorf("outputs beyond the engine's limit of %d files and directories: they come to %d", limit, n)
	}
	var sent []File
	for _, f := range files {
		up, err := w.uploadOutput(ctx, t.ID, f)
		if err != nil {
			return sent, notes, err
		}
		sent = append(sent, up)
	}
	return sent, notes, nil
}

// collectOutputs lists the files the outputs name under dir.
func collectOutputs(outputs []string, dir string) ([]outputFile, []string, error) {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, nil, err
	}
	var (
		files []outputFile
		notes []string
		seen  = map[string]bool{}
	)
	add := func(name, path string, size int64) {
		if !seen[name] {
			seen[name] = true
			files = append(files, outputFile{name: name, path: path, size: size})
		}
	}
	for _, name := range outputs {
		full := filepath.Join(dir, filepath.FromSlash(name))
		fi, err := os.Lstat(full)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			notes = append(notes, fmt.Sprintf("output %q: not there, skipped", name))
			continue
		}
		if err != nil {
			return nil, notes, fmt.Errorf("output %q: %w", name, err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return nil, notes, fmt.Errorf("output %q is a symlink; an output must be a file or a directory in the task's directory", name)
		}
		resolved, err := filepath.EvalSymlinks(full)
		if err != nil {
			return nil, notes, fmt.Errorf("output %q: %w", name, err)
		}
		if resolved != root && !strings.HasPrefix(resolved, root+string(filepath.Separator)) {
			return nil, notes, fmt.Errorf("output %q resolves to %s, outside the task's directory", name, resolved)
		}
		switch {
		case fi.Mode().IsRegular():
			add(name, full, fi.Size())
		case fi.IsDir():
			err := filepath.WalkDir(full, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				rel, err := filepath.Rel(full, p)
				if err != nil {
					return err
				}
				wire := name
				if rel != "." {
					wire = name + "/" + filepath.ToSlash(rel)
				}
				switch {
				case d.Type()&fs.ModeSymlink != 0:
					return fmt.Errorf("output %q: %s is a symlink; an output's files must be its own", name, wire)
				case d.IsDir():
					return nil
				case !d.Type().IsRegular():
					return fmt.Errorf("output %q: %s is not a regular file", name, wire)
				}
				info, err := d.Info()
				if err != nil {
					return err
				}
				add(wire, p, info.Size())
				return nil
			})
			if err != nil {
				return nil, notes, err
			}
		default:
			return nil, notes, fmt.Errorf("output %q is neither a regular file nor a directory", name)
		}
	}
	return files, notes, nil
}

// uploadOutput sends one output file and returns it as sent.
func (w *Client) uploadOutput(ctx context.Context, id string, o outputFile) (File, error) {
	fail := func(err error) (File, error) {
		return File{}, fmt.Errorf("could not upload output %q: %w", o.name, err)
	}
	// O_NOFOLLOW: a file that became a symlink since it was listed is
	// not followed.
	f, err := os.OpenFile(o.path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	if !fi.Mode().IsRegular() {
		return fail(errors.New("not a regular file"))
	}
	size := fi.Size()
	ctx, moved, release := stallGuard(ctx, stallAfter)
	defer release()
	var body *hashingBody
	resp, err := w.transfer(ctx, http.MethodPut, taskPath(id, "outputs", o.name), nil, func() (io.Reader, int64) {
		body = &hashingBody{r: moved(io.NewSectionReader(f, 0, size)), h: sha256.New(), closed: make(chan struct{})}
		return body, size
	})
	if err != nil {
		return fail(err)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, MaxRequestBody))
	resp.Body.Close()
	// The transport closes the body when it has done with it, maybe
	// after the answer: only then is the digest whole.
	<-body.closed
	if body.n != size {
		return fail(fmt.Errorf("the engine answered after %d of its %d bytes", body.n, size))
	}
	return File{Name: o.name, Size: size, SHA256: hex.EncodeToString(body.h.Sum(nil))}, nil
}

// hashingBody is an upload's body: it digests what the transport reads,
// and says when the transport has closed it.
type hashingBody struct {
	r      io.Reader
	h      hash.Hash
	n      int64
	once   sync.Once
	closed chan struct{}
}

func (b *hashingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.h.Write(p[:n])
	b.n += int64(n)
	return n, err
}

func (b *hashingBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}
