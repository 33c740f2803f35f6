package engine

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync/atomic"
	"syscall"
)

// The files of tasks, on the engine's side: inputs read from what
// Submit checked, and a directory of tasks that is the engine's own,
// written through a handle no path leaves.
//
// An input's Path is opened once at Submit, without following a
// symbolic link as its last element (O_NOFOLLOW: a link there is
// refused, with the path it names); the directories on the way to it
// are the caller's to choose and are followed as named. Submit records
// the file's identity (device, inode, size, modification and change
// times) beside its size and sha256, and every fetch opens the path the
// same way and serves it only when the file it finds has that identity:
// an input swapped for another file (a link to a secret, a renamed
// directory on the way) or changed in place since is refused 410 and the
// task fails saying so, before a byte is sent. The change time cannot be
// set by a user, so a write that keeps the size and resets the
// modification time is seen too.
//
// Rejected: holding each input's descriptor open from Submit to its
// task's end. It would serve the bytes that were checked even after a
// swap, but costs a descriptor per input of every queued task: 100,000
// queued tasks with an input each would pass the 20,000 descriptors a
// process is allowed here (RLIMIT_NOFILE), and a queue is what an engine
// holds most of. The identity check refuses what the open descriptor
// would have served: the operator's input changed under the task, and
// the task says so rather than run on another file.
//
// The directory of tasks (Config.TaskDir, or the engine's own under
// os.TempDir) is made 0700 or, when it is there already, taken only when
// the engine's user owns it and neither group nor others can write it
// (OpenSSH's StrictModes, for a directory every task's bytes go into);
// else the engine does not start, saying which and the fix. It is
// opened once as an os.Root, and every file and directory under it is
// made through that handle: a symbolic link under it (whoever made it)
// is not followed out of it, and the directory renamed or replaced after
// the check is not written through its old name.

// fileID is what identifies an input's file as Submit read it.
type fileID struct {
	dev, ino uint64
	size     int64
	// mtime and ctime are in nanoseconds; ctime is 0 where the system's
	// stat says none (changeTime).
	mtime, ctime int64
}

// statID is fi's identity; ok is false where the system says none.
func statID(fi fs.FileInfo) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: uint64(st.Ino), size: fi.Size(), mtime: fi.ModTime().UnixNano(), ctime: changeTime(st)}, true
}

// differs says, in words, how the file now differs from id; "" when it
// is the same file, unchanged.
func (id fileID) differs(now fileID) string {
	switch {
	case now.dev != id.dev || now.ino != id.ino:
		return "the path names another file now"
	case now.size != id.size:
		return fmt.Sprintf("it is %d bytes now, %d when the task was submitted", now.size, id.size)
	case now.mtime != id.mtime || now.ctime != id.ctime:
		return "it was written or changed since the task was submitted"
	}
	return ""
}

// openInput opens an input's Path for reading, refusing a symbolic link
// as its last element (O_NOFOLLOW), and says its identity. A path that
// is no regular file (a directory, a FIFO, a device) is refused: it is
// opened without blocking, so a FIFO cannot hold the caller.
func openInput(p string) (*os.File, fileID, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			if fi, lerr := os.Lstat(p); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
				return nil, fileID{}, fmt.Errorf("%s is a symbolic link; the engine reads an input from the file it names, not through a link: give the file's own path", p)
			}
		}
		return nil, fileID{}, fmt.Errorf("cannot read it: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fileID{}, fmt.Errorf("cannot read it: %w", err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fileID{}, fmt.Errorf("%s is not a regular file (%s); give a file", p, fi.Mode().Type())
	}
	id, _ := statID(fi)
	id.size = fi.Size()
	return f, id, nil
}

// reopenInput opens an input's Path as openInput does and returns it
// only when it is the file Submit read, unchanged (want); else an error
// saying what changed.
func reopenInput(p string, want fileID) (*os.File, error) {
	f, now, err := openInput(p)
	if err != nil {
		return nil, err
	}
	if why := want.differs(now); why != "" {
		f.Close()
		return nil, errors.New(why)
	}
	return f, nil
}

// OpenOwnDir makes dir (0700, and its parents) or checks the one that
// is there, and opens it as a root: it must be a directory the engine's
// user owns and neither group nor others can write, and not a symbolic
// link another user owns. The check is made on the opened directory, so
// what is checked is what is written in; an error names the directory,
// what is wrong and the fix. The engine opens Config.TaskDir with it; an
// embedder writing beside the tasks (host-example's -results) opens the
// same directory with it and writes through the root.
func OpenOwnDir(dir string) (*os.Root, error) { return ownDir(dir) }

func ownDir(dir string) (*os.Root, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("task directory %s: %w", dir, err)
	}
	if fi, err := os.Lstat(dir); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() && st.Uid != 0 {
			return nil, fmt.Errorf("task directory %s is a symbolic link owned by uid %d, who can point it anywhere: give a directory of the engine's user (uid %d), or a path that does not exist yet and the engine makes it", dir, st.Uid, os.Geteuid())
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("task directory %s: %w", dir, err)
	}
	fi, err := root.Stat(".")
	if err != nil {
		root.Close()
		return nil, fmt.Errorf("task directory %s: %w", dir, err)
	}
	if why := notOwn(fi); why != "" {
		root.Close()
		return nil, fmt.Errorf("task directory %s %s", dir, why)
	}
	return root, nil
}

// notOwn says why a directory is not the engine's alone, with the fix;
// "" when it is.
func notOwn(fi fs.FileInfo) string {
	me := os.Geteuid()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != me {
		return fmt.Sprintf("is owned by uid %d, not the engine's user (uid %d), who could change what the engine writes there: chown %d it, or give a path that does not exist yet and the engine makes it", st.Uid, me, me)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Sprintf("is writable by group or others (mode %#o), who could put links where the engine writes: chmod go-w it", perm)
	}
	return ""
}

// sealedWriter writes to w until sealed is set, then refuses: an upload
// still under way when its task's result is accepted is cut at its next
// write.
type sealedWriter struct {
	w      io.Writer
	sealed *atomic.Bool
}

// errSealed: the task's result was accepted while the upload was under
// way; its outputs are final.
var errSealed = errors.New("the task's result was accepted before this upload ended: its outputs are final")

func (s sealedWriter) Write(p []byte) (int, error) {
	if s.sealed.Load() {
		return 0, errSealed
	}
	return s.w.Write(p)
}
