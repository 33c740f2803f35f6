package engine

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fluksio/provision/worker"
)

// The transfer routes move a task's bytes between the engine and the
// worker that runs it (docs/worker-protocol.md): its inputs out, its
// stdout and stderr and its outputs in. Each is checked as every
// worker's request is (books.workerOf: credential, session, revocation)
// and allowed only to the worker that holds the attempt named in the
// path now; the task table (tasks.go) says whether the attempt is still
// the task's current one and where its files go. Bodies are copied
// between the connection and a file, never read whole; each transfer's
// deadlines are moved out for its size (transferDeadline), since the
// server's own are for small requests.

// maxLogChunk is the most one log append may carry.
const maxLogChunk = 1 << 20

// offsetHeader (worker.OffsetHeader) carries a stream's size as the engine kept it, on every
// answer to a log append.
const offsetHeader = worker.OffsetHeader

// minTransferRate is the slowest a transfer may go, in bytes a second,
// beyond readTimeout: a 100 MB input has readTimeout plus 100 s.
const minTransferRate = 1 << 20

// transferDeadline moves r's read and write deadlines out for a transfer
// of n bytes: readTimeout, and a second for each minTransferRate bytes.
// Where the connection cannot (a recorder in a test), nothing changes.
func transferDeadline(w http.ResponseWriter, n int64) {
	d := time.Now().Add(readTimeout + time.Duration(n/minTransferRate)*time.Second)
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(d)
	_ = rc.SetWriteDeadline(d)
}

// transferError is a transfer refused: its status and why.
type transferError struct {
	status int
	msg    string
}

func (e *transferError) Error() string { return e.msg }

func stale(attempt string) error {
	return &transferError{http.StatusConflict, "task " + attempt + " is not this worker's now"}
}

// transferCaller checks a transfer's request as every worker's request
// is, and that the worker holds the attempt the path names; on a
// refusal it has answered, without reading the body.
func (a *workerAPI) transferCaller(w http.ResponseWriter, r *http.Request) (caller, bool) {
	if a.tasks == nil {
		DontReadBody(w)
		WriteError(w, http.StatusNotFound, "this engine runs no tasks")
		return caller{}, false
	}
	c, d, reason := a.books.workerOf(r, r.PathValue("id"))
	switch d {
	case allowed:
		markCredentialed(r.Context())
		return c, true
	case badCredential:
		a.refuse(w, r, reason)
	case noSession, otherSession, nameRevoked:
		DontReadBody(w)
		a.refuseSession(w, r, d, c.cred.Worker, reason)
	case noSuchTask:
		// The session held: the connection is the worker's.
		markCredentialed(r.Context())
		DontReadBody(w)
		WriteError(w, http.StatusConflict, reason)
	default:
		DontReadBody(w)
		WriteError(w, d.status(), reason)
	}
	return caller{}, false
}

// writeTransferError answers err: a transferError's status and words,
// else 500. Any other error is the engine's own file system's, logged
// for the operator and not told to the worker (it names the engine's
// paths).
func (a *workerAPI) writeTransferError(w http.ResponseWriter, r *http.Request, err error) {
	var te *transferError
	if errors.As(err, &te) {
		WriteError(w, te.status, te.msg)
		return
	}
	a.logger.Error("a task's transfer failed on the engine's side", "path", r.URL.Path, "error", err)
	WriteError(w, http.StatusInternalServerError, "the engine could not keep or read the task's file; its log says why")
}

// -- inputs ----------------------------------------------------------------

// handleInput answers GET /v1/work/ID/inputs/NAME: the input's bytes,
// with its Content-Length, as the caller gave them to Submit.
func (a *workerAPI) handleInput(w http.ResponseWriter, r *http.Request) {
	c, ok := a.transferCaller(w, r)
	if !ok {
		return
	}
	attempt := r.PathValue("id")
	src, id, file, err := a.tasks.input(c.task, attempt, r.PathValue("name"))
	if err != nil {
		a.writeTransferError(w, r, err)
		return
	}
	if src.Path == "" {
		transferDeadline(w, file.Size)
		w.Header().Set("Content-Type", "application/octet-stream")
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(src.Data[:file.Size]))
		return
	}
	f, err := reopenInput(src.Path, id)
	if err != nil {
		// Not the file Submit read: nothing of it is sent, and the task
		// fails saying so.
		why := fmt.Sprintf("input %q (%s) is not as it was when task %s was submitted: %v; nothing of it was sent: submit the task again", file.Name, src.Path, c.task, err)
		a.tasks.refuseRun(c.task, attempt, why)
		a.logger.Warn("refused a task's input", "task", c.task, "input", file.Name, "path", src.Path, "why", err.Error())
		WriteError(w, http.StatusGone, why)
		return
	}
	defer f.Close()
	transferDeadline(w, file.Size)
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", time.Time{}, &inputFile{File: f, size: file.Size})
}

// inputFile is an input's file as Submit read it, for ServeContent:
// the file Submit read (reopenInput has checked it is, unchanged), its
// size and no more, read from its start. It is
// the *os.File underneath (SyscallConn), so that net/http hands the
// body to sendfile(2) from the page cache: copied through the engine
// instead (io.SectionReader, which sendfile does not take), 1 GB of
// inputs to 10 workers came at 0.72× of a plain http.FileServer's rate
// (bench, measurement 16).
type inputFile struct {
	*os.File
	size int64
	// off is the offset Read and Seek work from; the file's own offset
	// follows it, since sendfile reads from that.
	off int64
}

func (f *inputFile) Read(p []byte) (int, error) {
	if f.off >= f.size {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), f.size-f.off)]
	n, err := f.File.Read(p)
	f.off += int64(n)
	if err == io.EOF && f.off < f.size {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (f *inputFile) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		offset += f.off
	case io.SeekEnd:
		offset += f.size
	}
	if offset < 0 || offset > f.size {
		return f.off, fmt.Errorf("seek to %d of an input of %d bytes", offset, f.size)
	}
	if _, err := f.File.Seek(offset, io.SeekStart); err != nil {
		return f.off, err
	}
	f.off = offset
	return offset, nil
}

// WriteTo is not the file's: ServeContent's copy must stop at size,
// which the io.LimitReader it copies through says to sendfile.
func (f *inputFile) WriteTo(w io.Writer) (int64, error) {
	return io.Copy(w, struct{ io.Reader }{f})
}

// input is where the bytes of input name of task's attempt come from,
// and, for a Path, the identity of the file Submit read.
func (t *taskTable) input(task, attempt, name string) (Input, fileID, worker.File, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec := t.byID[task]
	if rec == nil || rec.run == nil || rec.run.id != attempt {
		return Input{}, fileID{}, worker.File{}, stale(attempt)
	}
	for i, f := range rec.files {
		if f.Name == name {
			var id fileID
			if rec.ids != nil {
				id = rec.ids[i]
			}
			return rec.sources[i], id, f, nil
		}
	}
	return Input{}, fileID{}, worker.File{}, &transferError{http.StatusNotFound, fmt.Sprintf("task %s has no input %q", task, name)}
}

// refuseRun marks task's attempt as failed for why, when its result
// comes, unless something else did first.
func (t *taskTable) refuseRun(task, attempt, why string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rec := t.byID[task]; rec != nil && rec.run != nil && rec.run.id == attempt && rec.run.over == "" {
		rec.run.over = why
	}
}

// seal makes task's attempt's outputs and streams final: its result was
// accepted. An upload or append begun after is refused, and one under
// way is cut (sealedWriter). The books call it as they accept the
// result, under their lock (the order is books.mu, then t.mu).
func (t *taskTable) seal(task, attempt string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rec := t.byID[task]; rec != nil && rec.run != nil && rec.run.id == attempt {
		rec.run.sealed.Store(true)
	}
}

// final is the refusal of a transfer after the attempt's result was
// accepted.
func final(attempt string) error {
	return &transferError{http.StatusConflict, "task " + attempt + "'s result was accepted: its outputs and streams are final"}
}

// -- logs ------------------------------------------------------------------

// handleLog answers POST /v1/work/ID/log/STREAM?offset=N: the body is
// the stream's next bytes from offset N. The engine appends it when N is
// the stream's size; a repeat of bytes it has (N+len at most its size)
// is answered as if appended; anything else is 409. Every 2xx is 204
// with offsetHeader, the size now. A stream beyond Limits.Log is
// refused 413, and the task fails when its result comes.
func (a *workerAPI) handleLog(w http.ResponseWriter, r *http.Request) {
	s, ok := streamIndex(r.PathValue("stream"))
	if !ok {
		DontReadBody(w)
		WriteError(w, http.StatusNotFound, fmt.Sprintf("no stream %q: stdout or stderr", r.PathValue("stream")))
		return
	}
	offset, err := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	if err != nil || offset < 0 {
		DontReadBody(w)
		WriteError(w, http.StatusBadRequest, "offset must be the stream's size before this chunk, a whole number of bytes (?offset=N)")
		return
	}
	c, ok := a.transferCaller(w, r)
	if !ok {
		return
	}
	attempt := r.PathValue("id")
	op, err := a.tasks.logOpen(c.task, attempt, s, offset)
	if err != nil {
		if op.size >= 0 {
			w.Header().Set(offsetHeader, strconv.FormatInt(op.size, 10))
		}
		DontReadBody(w)
		a.writeTransferError(w, r, err)
		return
	}
	transferDeadline(w, maxLogChunk)
	if op.f == nil {
		// A repeat, or bytes beyond the size that overlap it: which,
		// the body's length says.
		n, err := io.Copy(io.Discard, io.LimitReader(r.Body, maxLogChunk+1))
		switch {
		case err != nil:
			WriteError(w, http.StatusBadRequest, "reading the chunk: "+err.Error())
		case n > maxLogChunk:
			WriteError(w, http.StatusBadRequest, fmt.Sprintf("a log chunk is at most %d bytes", maxLogChunk))
		case offset+n <= op.size:
			w.Header().Set(offsetHeader, strconv.FormatInt(op.size, 10))
			w.WriteHeader(http.StatusNoContent)
		default:
			w.Header().Set(offsetHeader, strconv.FormatInt(op.size, 10))
			WriteError(w, http.StatusConflict, fmt.Sprintf("%s is %d bytes; a chunk at %d of %d bytes overlaps its end: send what follows byte %d", streamNames[s], op.size, offset, n, op.size))
		}
		return
	}
	most := min(int64(maxLogChunk), op.room)
	n, err := io.Copy(sealedWriter{io.NewOffsetWriter(op.f, op.size), &op.run.sealed}, io.LimitReader(r.Body, most+1))
	var over bool
	var refusal *transferError
	switch {
	case errors.Is(err, errSealed):
		refusal = final(attempt).(*transferError)
	case err != nil:
		refusal = &transferError{http.StatusBadRequest, "reading the chunk: " + err.Error()}
	case n > op.room:
		over = true
		refusal = &transferError{http.StatusRequestEntityTooLarge, overLog(s, a.tasks.limits.Log)}
	case n > maxLogChunk:
		refusal = &transferError{http.StatusBadRequest, fmt.Sprintf("a log chunk is at most %d bytes", maxLogChunk)}
	}
	if refusal != nil {
		op.f.Truncate(op.size)
		n = 0
	}
	op.f.Close()
	size := a.tasks.logDone(op, n, over)
	w.Header().Set(offsetHeader, strconv.FormatInt(size, 10))
	if refusal != nil {
		a.writeTransferError(w, r, refusal)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// overLog is why a stream was refused beyond the limit.
func overLog(s int, limit int64) string {
	return fmt.Sprintf("%s beyond the engine's limit of %d bytes", streamNames[s], limit)
}

// logOp is one log append under way: the stream's size when it began,
// the room left under the limit, and the file to append to (nil for a
// chunk that is not at the end: a repeat, or an overlap).
type logOp struct {
	rec  *taskRec
	run  *taskRun
	s    int
	size int64
	room int64
	f    *os.File
}

// logOpen begins an append to stream s of task's attempt at offset: the
// stream is marked busy and its file opened (under t.mu, so that a new
// attempt's directory cannot replace it between the check and the
// open). An error is the refusal; its logOp's size is the stream's when
// known (else -1).
func (t *taskTable) logOpen(task, attempt string, s int, offset int64) (logOp, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec := t.byID[task]
	if rec == nil || rec.run == nil || rec.run.id != attempt {
		return logOp{size: -1}, stale(attempt)
	}
	st := &rec.run.streams[s]
	op := logOp{rec: rec, run: rec.run, s: s, size: st.size, room: t.limits.Log - st.size}
	switch {
	case rec.run.sealed.Load():
		return op, final(attempt)
	case st.busy:
		return op, &transferError{http.StatusConflict, streamNames[s] + " is being appended to already; send one chunk at a time"}
	case offset > st.size:
		return op, &transferError{http.StatusConflict, fmt.Sprintf("%s is %d bytes; a chunk at %d leaves a gap: send what follows byte %d", streamNames[s], st.size, offset, st.size)}
	case offset < st.size:
		return op, nil
	}
	if t.dirLocked(task) == "" || t.dirs == nil {
		return op, &transferError{http.StatusServiceUnavailable, "the engine has no directory for tasks yet"}
	}
	if err := t.dirs.Mkdir(task, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return op, err
	}
	f, err := t.dirs.OpenFile(path.Join(task, streamNames[s]), os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return op, err
	}
	st.busy = true
	op.f = f
	return op, nil
}

// logDone ends an append that wrote n bytes (0 when refused; over when
// refused beyond the limit) and returns the stream's size now.
func (t *taskTable) logDone(op logOp, n int64, over bool) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := &op.run.streams[op.s]
	st.busy = false
	if op.rec.run != op.run {
		// The attempt ended meanwhile: its file is another's now.
		return st.size
	}
	if over && op.run.over == "" {
		op.run.over = overLog(op.s, t.limits.Log)
	}
	st.size += n
	return st.size
}

// -- outputs ---------------------------------------------------------------

// handleOutput answers PUT /v1/work/ID/outputs/PATH: the body is the
// output's bytes, written under TaskDir(name)/outputs/PATH. PATH must be
// one of the task's outputs or under one (a directory); one that is not
// written plainly or leaves the directory is refused 400, and the
// outputs together beyond Limits.Outputs (bytes, a directory counting
// dirBytes) or Limits.Files (files and directories) 413 (the task then
// fails). The bytes go to a partial file first, which takes the
// output's name only when the whole body came and the attempt's result
// was not accepted meanwhile: an output the result recorded is never
// rewritten.
func (a *workerAPI) handleOutput(w http.ResponseWriter, r *http.Request) {
	p := r.PathValue("path")
	if err := checkRelPath("output", p); err != nil {
		DontReadBody(w)
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	c, ok := a.transferCaller(w, r)
	if !ok {
		return
	}
	op, err := a.tasks.outputOpen(c.task, r.PathValue("id"), p, r.ContentLength)
	if err != nil {
		DontReadBody(w)
		a.writeTransferError(w, r, err)
		return
	}
	transferDeadline(w, op.want)
	h := sha256.New()
	n, err := io.Copy(sealedWriter{io.MultiWriter(op.f, h), &op.run.sealed}, io.LimitReader(r.Body, op.want+1))
	op.f.Close()
	var refusal *transferError
	switch {
	case errors.Is(err, errSealed):
		refusal = final(r.PathValue("id")).(*transferError)
	case err != nil:
		refusal = &transferError{http.StatusBadRequest, "reading the output: " + err.Error()}
	case n > op.want:
		refusal = &transferError{http.StatusRequestEntityTooLarge, overOutputs(a.tasks.limits.Outputs)}
	}
	file := worker.File{Name: p, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}
	if err := a.tasks.outputDone(op, file, refusal); err != nil {
		a.writeTransferError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// overOutputs is why an output was refused beyond the limit.
func overOutputs(limit int64) string {
	return fmt.Sprintf("outputs beyond the engine's limit of %d bytes for one task's outputs", limit)
}

// overFiles is why an output was refused beyond the files limit.
func overFiles(limit int64) string {
	return fmt.Sprintf("outputs beyond the engine's limit of %d files and directories for one task's outputs", limit)
}

// outputOp is one output upload under way: the bytes it reserved of the
// outputs' limit, whether it reserved a file of the files' limit (a new
// output), and the partial file it writes (partial, under the tasks'
// root) for the output's name (dest).
type outputOp struct {
	rec     *taskRec
	run     *taskRun
	dirs    *os.Root
	path    string
	dest    string
	partial string
	want    int64
	newFile bool
	f       *os.File
}

// outputOpen begins an upload of output p of task's attempt, announced
// as length bytes (-1: not said): p must be an output of the task's or
// under one; the room it may use is reserved (all that is left when its
// length is not said), the directories it lies in are made and counted
// one by one, and its partial file is opened, all through the tasks'
// root, which no path leaves (under t.mu, as logOpen).
func (t *taskTable) outputOpen(task, attempt, p string, length int64) (outputOp, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec := t.byID[task]
	if rec == nil || rec.run == nil || rec.run.id != attempt {
		return outputOp{}, stale(attempt)
	}
	if rec.run.sealed.Load() {
		return outputOp{}, final(attempt)
	}
	if !slices.ContainsFunc(rec.outputs, func(o string) bool { return p == o || strings.HasPrefix(p, o+"/") }) {
		return outputOp{}, &transferError{http.StatusBadRequest, fmt.Sprintf("%q is not one of task %s's outputs (%s), nor under one", p, task, strings.Join(rec.outputs, ", "))}
	}
	run := rec.run
	refuse := func(why string) error {
		if run.over == "" {
			run.over = why
		}
		return &transferError{http.StatusRequestEntityTooLarge, why}
	}
	room := t.limits.Outputs - (run.outputBytes - run.outputs[p].Size) - run.reserved
	want := length
	if want < 0 {
		want = max(room, 0)
	}
	if want > room {
		return outputOp{}, refuse(overOutputs(t.limits.Outputs))
	}
	_, had := run.outputs[p]
	newFile := !had
	if newFile && run.inodes+run.reservedFiles+1 > t.limits.Files {
		return outputOp{}, refuse(overFiles(t.limits.Files))
	}
	if t.dirLocked(task) == "" || t.dirs == nil {
		return outputOp{}, &transferError{http.StatusServiceUnavailable, "the engine has no directory for tasks yet"}
	}
	dirs := t.dirs
	for _, d := range []string{task, path.Join(task, "outputs")} {
		if err := dirs.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return outputOp{}, err
		}
	}
	// Each directory the path needs is made here, one at a time, and
	// counted as it is made: what a worker's paths make counts against
	// its limits, whatever their shape.
	dest := path.Join(task, "outputs", p)
	if parent := path.Dir(p); parent != "." {
		if fi, err := dirs.Lstat(path.Join(task, "outputs", parent)); err != nil || !fi.IsDir() {
			if err := t.makeOutputDirs(run, dirs, path.Join(task, "outputs"), p, want); err != nil {
				return outputOp{}, err
			}
		}
	}
	run.uploads++
	partial := path.Join(task, fmt.Sprintf(".partial-%s-%d", attempt, run.uploads))
	f, err := dirs.OpenFile(partial, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return outputOp{}, &transferError{http.StatusConflict, fmt.Sprintf("output %q: %v", p, err)}
	}
	run.reserved += want
	if newFile {
		run.reservedFiles++
	}
	return outputOp{rec: rec, run: run, dirs: dirs, path: p, dest: dest, partial: partial, want: want, newFile: newFile, f: f}, nil
}

// makeOutputDirs makes the directories output p of run lies in, under
// outputs (a name in dirs), counting each it makes against the limits
// (the file to come, of want bytes, needs its own room too). It steps
// down one directory handle at a time, so that a path of n directories
// costs n steps, not n². t.mu must be held.
func (t *taskTable) makeOutputDirs(run *taskRun, dirs *os.Root, outputs, p string, want int64) error {
	r, err := dirs.OpenRoot(outputs)
	if err != nil {
		return err
	}
	defer func() { r.Close() }()
	for _, elem := range strings.Split(path.Dir(p), "/") {
		if fi, err := r.Lstat(elem); err != nil || !fi.IsDir() {
			var why string
			switch {
			case run.inodes+run.reservedFiles+2 > t.limits.Files:
				why = overFiles(t.limits.Files)
			case run.outputBytes+run.reserved+want+dirBytes > t.limits.Outputs:
				why = overOutputs(t.limits.Outputs)
			}
			if why != "" {
				if run.over == "" {
					run.over = why
				}
				return &transferError{http.StatusRequestEntityTooLarge, why}
			}
			if err := r.Mkdir(elem, 0o700); err != nil {
				return &transferError{http.StatusConflict, fmt.Sprintf("output %q: %v", p, err)}
			}
			run.inodes++
			run.outputBytes += dirBytes
		}
		next, err := r.OpenRoot(elem)
		if err != nil {
			return &transferError{http.StatusConflict, fmt.Sprintf("output %q: %v", p, err)}
		}
		r.Close()
		r = next
	}
	return nil
}

// outputDone ends an upload: its reservations are given back, and the
// partial file becomes the output (refusal nil, the attempt current and
// its result not accepted) or is removed; beyond a limit marks the
// attempt, so that its task fails. The error is the refusal to answer
// with, nil when the output was kept.
func (t *taskTable) outputDone(op outputOp, file worker.File, refusal *transferError) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	op.run.reserved -= op.want
	if op.newFile {
		op.run.reservedFiles--
	}
	switch {
	case refusal != nil:
	case op.rec.run != op.run:
		refusal = stale(op.run.id).(*transferError)
	case op.run.sealed.Load():
		refusal = final(op.run.id).(*transferError)
	}
	if refusal == nil {
		if err := op.dirs.Rename(op.partial, op.dest); err != nil {
			op.dirs.Remove(op.partial)
			return &transferError{http.StatusConflict, fmt.Sprintf("output %q: %v", op.path, err)}
		}
		old, had := op.run.outputs[op.path]
		if !had {
			op.run.inodes++
		}
		op.run.outputBytes += file.Size - old.Size
		op.run.outputs[op.path] = file
		return nil
	}
	op.dirs.Remove(op.partial)
	if refusal.status == http.StatusRequestEntityTooLarge && op.rec.run == op.run && op.run.over == "" {
		op.run.over = refusal.msg
	}
	return refusal
}
