package resources

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// MaxInlineContent caps a file spec's inline content: a manifest is a KV
// value, not a file store.
const MaxInlineContent = 64 << 10

// DefaultFileMaxSize is a file spec's max_size when it gives none: the
// most the agent reads of the file to hash it.
const DefaultFileMaxSize = 64 << 20

// maxFileMaxSize bounds max_size itself.
const maxFileMaxSize = 1 << 40

// OwnerXattr is the extended attribute that marks a file the file kind
// wrote: its value is "<agent>/<id>". The agent deletes only files that
// carry it, or that its state directory records (filesystems without user
// extended attributes, such as tmpfs before Linux 6.6).
const OwnerXattr = "user.understudy.owner"

// TempPrefix begins the name of every temporary file the file kind writes
// (".<name>.understudy-<random>", beside the file): one left by a crash
// is removed by the next reconcile, delete or start of its resource.
const TempPrefix = ".understudy-"

// File manages one regular file: path, mode, optional owner, and its
// content given inline or pinned by sha256. Drift is a change of content,
// mode or owner.
//
// It reads files as streams (hashing while reading, at most max_size
// bytes), never opens anything but a regular file (a FIFO, a device, a
// directory or a symbolic link at the path is an error, found with
// lstat before any open), refuses to write through a directory or a
// symbolic link that neither root nor the agent's user owns, and deletes
// only files it wrote (OwnerXattr, or a record in StateDir). Its methods
// may be called concurrently for different resources; each honours its
// context between chunks of its reads.
type File struct {
	// Agent names the agent in ownership markers ("<agent>/<id>").
	Agent string
	// StateDir, when set, holds a record of every file written
	// (StateDir/files/<id>): ownership where extended attributes are
	// not supported.
	StateDir string

	mu    sync.Mutex
	cache map[string]fileSum // path → the digest of a file identity
}

// NewFile returns the file kind of agent, keeping its records in
// stateDir ("" keeps none).
func NewFile(agent, stateDir string) *File { return &File{Agent: agent, StateDir: stateDir} }

// fileSum remembers a file's digest by its identity and times: a 1 GiB
// pinned file unchanged since the last observation is not read again.
type fileSum struct {
	dev, ino     uint64
	size         int64
	mtime, ctime syscall.Timespec
	sum          string
}

// fileSpec is a file resource's typed spec.
type fileSpec struct {
	Path    string
	Mode    fs.FileMode
	Owner   string // "user" or "user:group" (names or numbers); "": leave as is
	Content *string
	SHA256  string // hex; with Content: must match it; alone: the content must already have it
	MaxSize int64  // the most read of the file
}

func (*File) Kind() string { return "file" }

func (f *File) Validate(spec Spec) error { _, err := f.spec(spec); return err }

// Identity makes two file resources of one path one thing (refused by the
// manifest).
func (f *File) Identity(_ string, spec Spec) string {
	s, err := f.spec(spec)
	if err != nil {
		return ""
	}
	return "file " + s.Path
}

func (*File) spec(spec Spec) (fileSpec, error) {
	r := NewSpecReader("file", spec)
	var s fileSpec
	s.Path = r.Str("path", true)
	mode := r.Str("mode", false)
	if _, ok := spec["content"]; ok {
		c := r.Str("content", false)
		s.Content = &c
	} else {
		r.seen["content"] = true
	}
	s.SHA256 = strings.ToLower(r.Str("sha256", false))
	s.Owner = r.Str("owner", false)
	s.MaxSize = r.Size("max_size", DefaultFileMaxSize)
	if err := r.Done(); err != nil {
		return s, err
	}
	switch {
	case !filepath.IsAbs(s.Path) || filepath.Clean(s.Path) != s.Path:
		return s, &SpecError{"file", "path", fmt.Sprintf("must be an absolute, clean path (got %s)", s.Path)}
	case s.Path == "/":
		return s, &SpecError{"file", "path", "must name a file, not the root directory"}
	case s.Content == nil && s.SHA256 == "":
		return s, &SpecError{"file", "content", "give content, or sha256 of the content the file must have"}
	case s.Content != nil && len(*s.Content) > MaxInlineContent:
		return s, &SpecError{"file", "content", fmt.Sprintf("at most %d bytes inline (got %d); pin larger files by sha256", MaxInlineContent, len(*s.Content))}
	case s.MaxSize < 1 || s.MaxSize > maxFileMaxSize:
		return s, &SpecError{"file", "max_size", fmt.Sprintf("must be from 1 byte to 1TiB (got %d)", s.MaxSize)}
	case s.Content != nil && int64(len(*s.Content)) > s.MaxSize:
		return s, &SpecError{"file", "max_size", fmt.Sprintf("must be at least the content's %d bytes (got %d)", len(*s.Content), s.MaxSize)}
	}
	if s.SHA256 != "" {
		if b, err := hex.DecodeString(s.SHA256); err != nil || len(b) != sha256.Size {
			return s, &SpecError{"file", "sha256", fmt.Sprintf("must be 64 hex digits (got %s)", s.SHA256)}
		}
		if s.Content != nil && digest([]byte(*s.Content)) != s.SHA256 {
			return s, &SpecError{"file", "sha256", "does not match content"}
		}
	}
	s.Mode = 0o644
	if mode != "" {
		m, err := strconv.ParseUint(mode, 8, 32)
		if err != nil || m > 0o777 {
			return s, &SpecError{"file", "mode", fmt.Sprintf("must be octal permission bits from 0000 to 0777, such as \"0644\" (got %s)", mode)}
		}
		s.Mode = fs.FileMode(m)
	}
	if s.Owner != "" {
		if _, _, err := lookupOwner(s.Owner); err != nil {
			return s, &SpecError{"file", "owner", err.Error()}
		}
	}
	return s, nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func (f *File) Observe(ctx context.Context, _ string, spec Spec) (Observation, error) {
	s, err := f.spec(spec)
	if err != nil {
		return Observation{}, err
	}
	if err := safeParents(s.Path); err != nil {
		return Observation{}, err
	}
	return f.observe(ctx, s)
}

// errNotRegular: something other than a regular file is at the path.
var errNotRegular = errors.New("the file kind manages regular files only")

// fileType names what a mode is, for an error.
func fileType(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "not a regular file"
}

// observe looks at the file without following a symbolic link and without
// opening anything but a regular file (a FIFO's open can block, a
// device's can have effects), then hashes at most s.MaxSize bytes of it.
func (f *File) observe(ctx context.Context, s fileSpec) (Observation, error) {
	lst, err := os.Lstat(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return Observation{Drift: "file missing"}, nil
	}
	if err != nil {
		return Observation{}, err
	}
	if !lst.Mode().IsRegular() {
		return Observation{}, fmt.Errorf("%s is %s: %w; remove it or manage another path", s.Path, fileType(lst.Mode()), errNotRegular)
	}
	fh, err := os.OpenFile(s.Path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return Observation{}, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return Observation{}, err
	}
	if !st.Mode().IsRegular() || !os.SameFile(st, lst) {
		return Observation{}, fmt.Errorf("%s changed while it was being opened; observing again", s.Path)
	}
	o := Observation{Details: map[string]string{"mode": fmt.Sprintf("%04o", st.Mode().Perm()), "size": strconv.FormatInt(st.Size(), 10)}}
	var drift []string
	switch {
	case s.Content != nil && st.Size() != int64(len(*s.Content)):
		drift = append(drift, "content changed") // no need to read it
	case st.Size() > s.MaxSize:
		return o, fmt.Errorf("%s is %d bytes, more than max_size %d: raise max_size to check it", s.Path, st.Size(), s.MaxSize)
	default:
		sum, err := f.sum(ctx, fh, st, s.MaxSize)
		if err != nil {
			return o, fmt.Errorf("%s: %w", s.Path, err)
		}
		o.Details["sha256"] = sum
		want := s.SHA256
		if s.Content != nil {
			want = digest([]byte(*s.Content))
		}
		if sum != want {
			drift = append(drift, "content changed")
		}
	}
	if st.Mode().Perm() != s.Mode.Perm() {
		drift = append(drift, fmt.Sprintf("mode %04o, want %04o", st.Mode().Perm(), s.Mode.Perm()))
	}
	if s.Owner != "" {
		uid, gid, _ := lookupOwner(s.Owner)
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && (int(sys.Uid) != uid || (gid >= 0 && int(sys.Gid) != gid)) {
			drift = append(drift, fmt.Sprintf("owner %d:%d, want %s", sys.Uid, sys.Gid, s.Owner))
		}
	}
	o.Drift = strings.Join(drift, "; ")
	o.InSync = o.Drift == ""
	return o, nil
}

// sum hashes fh as it reads it, in chunks, checking ctx between them;
// an unchanged file (same inode, size and times) is not read again.
func (f *File) sum(ctx context.Context, fh *os.File, st fs.FileInfo, limit int64) (string, error) {
	sys, _ := st.Sys().(*syscall.Stat_t)
	var id fileSum
	if sys != nil {
		id = fileSum{dev: sys.Dev, ino: sys.Ino, size: sys.Size, mtime: sys.Mtim, ctime: sys.Ctim}
		f.mu.Lock()
		c, ok := f.cache[fh.Name()]
		f.mu.Unlock()
		if ok && c.dev == id.dev && c.ino == id.ino && c.size == id.size && c.mtime == id.mtime && c.ctime == id.ctime {
			return c.sum, nil
		}
	}
	h := sha256.New()
	buf := make([]byte, 64<<10)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return "", fmt.Errorf("hashing cut off after %d bytes: %w", n, err)
		}
		k, err := fh.Read(buf)
		n += int64(k)
		if n > limit {
			return "", fmt.Errorf("grew past max_size %d while being read", limit)
		}
		h.Write(buf[:k])
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", err
		}
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if sys != nil {
		id.sum = sum
		f.mu.Lock()
		if f.cache == nil {
			f.cache = map[string]fileSum{}
		}
		f.cache[fh.Name()] = id
		f.mu.Unlock()
	}
	return sum, nil
}

func (f *File) Reconcile(ctx context.Context, id string, spec Spec) (Observation, error) {
	s, err := f.spec(spec)
	if err != nil {
		return Observation{}, err
	}
	if err := safeParents(s.Path); err != nil {
		return Observation{}, err
	}
	o, err := f.observe(ctx, s)
	if err != nil || o.InSync {
		return o, err
	}
	if s.Content == nil {
		return o, fmt.Errorf("%s does not have sha256 %s and the spec has no content to write", s.Path, s.SHA256)
	}
	sweepTemps(s.Path)
	if err := os.MkdirAll(filepath.Dir(s.Path), 0o755); err != nil {
		return Observation{}, err
	}
	if err := safeParents(s.Path); err != nil { // what MkdirAll made, or raced with it
		return Observation{}, err
	}
	if err := f.write(id, s); err != nil {
		return Observation{}, err
	}
	f.record(id, s.Path)
	return f.observe(ctx, s)
}

// write replaces the file by a new one, whole: a temporary file beside
// it, marked as the resource's, synced, then renamed over it.
func (f *File) write(id string, s fileSpec) error {
	dir := filepath.Dir(s.Path)
	var rnd [6]byte
	if _, err := io.ReadFull(randReader, rnd[:]); err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+filepath.Base(s.Path)+TempPrefix+hex.EncodeToString(rnd[:]))
	fh, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	fail := func(err error) error { fh.Close(); return err }
	if _, err := fh.WriteString(*s.Content); err != nil {
		return fail(err)
	}
	if err := setOwnerXattr(fh, f.Agent+"/"+id); err != nil {
		return fail(err)
	}
	if err := fh.Chmod(s.Mode); err != nil {
		return fail(err)
	}
	if s.Owner != "" {
		uid, gid, _ := lookupOwner(s.Owner)
		if err := fh.Chown(uid, gid); err != nil {
			return fail(fmt.Errorf("owner %s: %w", s.Owner, err))
		}
	}
	if err := fh.Sync(); err != nil {
		return fail(err)
	}
	if err := fh.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.Path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // the rename survives a power cut
		d.Close()
	}
	return nil
}

// Delete removes the file only if this agent's resource id wrote it (its
// OwnerXattr, or its record in StateDir): a resource that only pins a
// sha256 never wrote anything and deletes nothing, and a file put in its
// place by someone else stays.
func (f *File) Delete(ctx context.Context, id string, spec Spec) error {
	s, err := f.spec(spec)
	if err != nil {
		return err
	}
	if err := safeParents(s.Path); err != nil {
		return err
	}
	sweepTemps(s.Path)
	lst, err := os.Lstat(s.Path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		f.forget(id)
		return nil
	case err != nil:
		return err
	case !lst.Mode().IsRegular() || s.Content == nil || !f.owns(id, s.Path):
		f.forget(id) // not a file this resource wrote: left as it is
		return nil
	}
	if err := os.Remove(s.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f.mu.Lock()
	delete(f.cache, s.Path)
	f.mu.Unlock()
	f.forget(id)
	return nil
}

// Recover removes the temporary files a crash left beside the file
// (called once when the agent starts managing the resource).
func (f *File) Recover(_ context.Context, _ string, spec Spec) error {
	s, err := f.spec(spec)
	if err != nil {
		return err
	}
	if err := safeParents(s.Path); err != nil {
		return nil // Observe reports it
	}
	sweepTemps(s.Path)
	return nil
}

// sweepTemps removes ".<name>.understudy-*" regular files beside path.
func sweepTemps(path string) {
	dir, base := filepath.Dir(path), filepath.Base(path)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	prefix := "." + base + TempPrefix
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) && e.Type().IsRegular() {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// fileRecord is StateDir/files/<id>: the file kind wrote path for id.
type fileRecord struct {
	Agent string `json:"agent"`
	ID    string `json:"id"`
	Path  string `json:"path"`
}

func (f *File) recordPath(id string) string { return filepath.Join(f.StateDir, "files", id) }

func (f *File) record(id, path string) {
	if f.StateDir == "" {
		return
	}
	b, _ := json.Marshal(fileRecord{Agent: f.Agent, ID: id, Path: path})
	_ = WriteState(f.recordPath(id), b)
}

func (f *File) forget(id string) {
	if f.StateDir != "" {
		_ = os.Remove(f.recordPath(id))
	}
}

// owns reports whether resource id wrote the file at path: its marker
// names agent/id, or (no marker) the state directory records it.
func (f *File) owns(id, path string) bool {
	v, err := readOwnerMarker(path)
	switch {
	case err == nil:
		return v == f.Agent+"/"+id
	case errors.Is(err, fs.ErrNotExist):
		return false // the filesystem keeps markers; this file has none
	case f.StateDir == "":
		return false
	}
	b, err := os.ReadFile(f.recordPath(id))
	if err != nil || len(b) > 64<<10 {
		return false
	}
	var r fileRecord
	return json.Unmarshal(b, &r) == nil && r.Path == path && r.ID == id
}

// readOwnerMarker is getOwnerXattr (a test stands in a filesystem
// without extended attributes).
var readOwnerMarker = getOwnerXattr

func setOwnerXattr(fh *os.File, value string) error {
	err := fsetxattr(int(fh.Fd()), OwnerXattr, []byte(value))
	if errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.EOPNOTSUPP) {
		return nil // the record in StateDir stands for it
	}
	if err != nil {
		return fmt.Errorf("mark %s as understudy's (%s): %w", fh.Name(), OwnerXattr, err)
	}
	return nil
}

// getOwnerXattr reads the marker without following a symbolic link;
// fs.ErrNotExist when the file has none.
func getOwnerXattr(path string) (string, error) {
	buf := make([]byte, 256)
	n, err := lgetxattr(path, OwnerXattr, buf)
	if errors.Is(err, syscall.ENODATA) {
		return "", fs.ErrNotExist
	}
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// safeParents walks the directories above path from the root and refuses
// one that neither root nor this process's user owns, one that others may
// write without the sticky bit, and a symbolic link that neither owns:
// whoever controls such a component could point a write of the agent (as
// root: anywhere) at a file of their choosing. A symbolic link both
// trust is followed, and its target walked the same way. A missing
// directory ends the walk (the agent creates it, under a trusted one).
func safeParents(path string) error {
	uid := uint32(os.Geteuid())
	trusted := func(st *syscall.Stat_t) bool { return st.Uid == 0 || st.Uid == uid }
	comps := strings.Split(filepath.Dir(path), "/")
	cur := "/"
	for hops := 0; len(comps) > 0; {
		c := comps[0]
		comps = comps[1:]
		if c == "" || c == "." {
			continue
		}
		next := filepath.Join(cur, c)
		var st syscall.Stat_t
		if err := syscall.Lstat(next, &st); err != nil {
			if errors.Is(err, syscall.ENOENT) {
				return nil
			}
			return &os.PathError{Op: "lstat", Path: next, Err: err}
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFLNK:
			if !trusted(&st) {
				return fmt.Errorf("%s: %s is a symbolic link owned by uid %d, neither root nor this agent (uid %d): refusing to follow it", path, next, st.Uid, uid)
			}
			if hops++; hops > 40 {
				return fmt.Errorf("%s: too many symbolic links", path)
			}
			target, err := os.Readlink(next)
			if err != nil {
				return err
			}
			if filepath.IsAbs(target) {
				cur = "/"
			}
			comps = append(strings.Split(target, "/"), comps...)
		case syscall.S_IFDIR:
			if !trusted(&st) {
				return fmt.Errorf("%s: directory %s belongs to uid %d, neither root nor this agent (uid %d): refusing to write through it", path, next, st.Uid, uid)
			}
			if st.Mode&0o022 != 0 && st.Mode&syscall.S_ISVTX == 0 {
				return fmt.Errorf("%s: directory %s is writable by others (mode %04o, no sticky bit): refusing to write through it", path, next, st.Mode&0o7777)
			}
			cur = next
		default:
			return fmt.Errorf("%s: %s is not a directory", path, next)
		}
	}
	return nil
}

// lookupOwner resolves "user[:group]" (names or numbers); gid -1: keep.
func lookupOwner(owner string) (uid, gid int, err error) {
	name, group, hasGroup := strings.Cut(owner, ":")
	uid, err = strconv.Atoi(name)
	if err != nil {
		u, lerr := user.Lookup(name)
		if lerr != nil {
			return 0, 0, fmt.Errorf("no user %s", name)
		}
		uid, _ = strconv.Atoi(u.Uid)
	}
	gid = -1
	if hasGroup {
		gid, err = strconv.Atoi(group)
		if err != nil {
			g, lerr := user.LookupGroup(group)
			if lerr != nil {
				return 0, 0, fmt.Errorf("no group %s", group)
			}
			gid, _ = strconv.Atoi(g.Gid)
		}
	}
	return uid, gid, nil
}

// fsetxattr and lgetxattr are the system calls (package syscall has only
// the variants that take a path and follow symbolic links).
func fsetxattr(fd int, name string, value []byte) error {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return err
	}
	_, _, e := syscall.Syscall6(syscall.SYS_FSETXATTR, uintptr(fd), uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(&value[0])), uintptr(len(value)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func lgetxattr(path, name string, buf []byte) (int, error) {
	pp, err := syscall.BytePtrFromString(path)
	if err != nil {
		return 0, err
	}
	np, err := syscall.BytePtrFromString(name)
	if err != nil {
		return 0, err
	}
	n, _, e := syscall.Syscall6(syscall.SYS_LGETXATTR, uintptr(unsafe.Pointer(pp)), uintptr(unsafe.Pointer(np)), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
