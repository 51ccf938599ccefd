package resources

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Finding: path: /dev/zero ran the node out of memory (io.ReadAll of an
// endless device). A device is refused after lstat, without an open.
func TestFileRefusesADevice(t *testing.T) {
	f := NewFile("n1", t.TempDir())
	spec := Spec{"path": "/dev/zero", "content": "x"}
	for name, call := range map[string]func() error{
		"observe":   func() error { _, err := f.Observe(context.Background(), "z", spec); return err },
		"reconcile": func() error { _, err := f.Reconcile(context.Background(), "z", spec); return err },
	} {
		if err := call(); err == nil || !strings.Contains(err.Error(), "/dev/zero is a character device: the file kind manages regular files only") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := f.Delete(context.Background(), "z", spec); err != nil {
		t.Errorf("delete: %v", err)
	}
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Errorf("/dev/zero: %v", err)
	}
}

// Finding: a FIFO at the path blocked the resource past call_timeout and
// then the agent's shutdown. It is refused at once, never opened.
func TestFileRefusesAFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
	f := NewFile("n1", t.TempDir())
	spec := Spec{"path": path, "content": "x"}
	done := make(chan error, 1)
	go func() {
		_, err := f.Reconcile(context.Background(), "p", spec)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "is a FIFO: the file kind manages regular files only") {
			t.Errorf("reconcile: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reconcile blocked on a FIFO")
	}
	if err := f.Delete(context.Background(), "p", spec); err != nil {
		t.Errorf("delete: %v", err)
	}
	if st, err := os.Lstat(path); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("the FIFO was touched: %v %v", st, err)
	}
}

// Finding: a 1 GiB file pinned by sha256 cost 1.5 GB at every observe.
// It is hashed as a stream (memory stays bounded), refused above
// max_size (64 MiB by default) without being read, and not read again
// while it has not changed.
func TestFileHashesALargeFileInBoundedMemory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big")
	if out, err := exec.Command("truncate", "-s", "1G", path).CombinedOutput(); err != nil {
		t.Fatalf("truncate: %v: %s", err, out)
	}
	f := NewFile("n1", t.TempDir())
	ctx := context.Background()
	pin := strings.Repeat("0", 64)
	if _, err := f.Observe(ctx, "big", Spec{"path": path, "sha256": pin}); err == nil || !strings.Contains(err.Error(), "is 1073741824 bytes, more than max_size 67108864: raise max_size") {
		t.Errorf("over the default max_size: %v", err)
	}
	spec := Spec{"path": path, "sha256": pin, "max_size": "2GiB"}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	o, err := f.Observe(ctx, "big", spec)
	runtime.ReadMemStats(&after)
	if err != nil || o.InSync || o.Drift != "content changed" || o.Details["size"] != "1073741824" || o.Details["sha256"] != "49bc20df15e412a64472421e13fe86ff1c5165e18b2afccf160d4dc19fe68a14" {
		t.Fatalf("observe: %+v %v", o, err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4<<20 {
		t.Errorf("hashing 1 GiB allocated %d bytes", alloc)
	}
	start := time.Now()
	if o, err := f.Observe(ctx, "big", spec); err != nil || o.Details["sha256"] != "49bc20df15e412a64472421e13fe86ff1c5165e18b2afccf160d4dc19fe68a14" {
		t.Errorf("again: %+v %v", o, err)
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("an unchanged file was read again (%v)", took)
	}
	// Every call honours its context.
	if err := os.Chtimes(path, time.Now(), time.Now()); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := f.Observe(cctx, "big", spec); err == nil || !strings.Contains(err.Error(), "hashing cut off after 0 bytes") {
		t.Errorf("cancelled: %v", err)
	}
}

// Finding: removing a file resource that only pins sha256 deleted a file
// understudy never wrote. Delete removes only what the resource wrote.
func TestFileDeletesOnlyWhatItWrote(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	f := NewFile("n1", t.TempDir())
	theirs := filepath.Join(dir, "theirs")
	if err := os.WriteFile(theirs, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	pinned := Spec{"path": theirs, "sha256": digest([]byte("x"))}
	if o, err := f.Reconcile(ctx, "pin", pinned); err != nil || !o.InSync {
		t.Fatalf("pinned: %+v %v", o, err)
	}
	if err := f.Delete(ctx, "pin", pinned); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(theirs); err != nil {
		t.Errorf("a pinned file was deleted: %v", err)
	}
	// Written by the resource: marked, and deleted.
	ours := filepath.Join(dir, "ours")
	spec := Spec{"path": ours, "content": "y"}
	if _, err := f.Reconcile(ctx, "ours", spec); err != nil {
		t.Fatal(err)
	}
	if v, err := getOwnerXattr(ours); err != nil || v != "n1/ours" {
		t.Errorf("marker %q %v", v, err)
	}
	// Another resource id, or another agent, does not own it.
	if err := NewFile("n2", "").Delete(ctx, "ours", spec); err != nil {
		t.Fatal(err)
	}
	if err := f.Delete(ctx, "other", spec); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ours); err != nil {
		t.Fatalf("deleted by a resource that did not write it: %v", err)
	}
	// Replaced behind the agent's back by a file of someone else's: kept.
	if err := os.Remove(ours); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ours, []byte("mine now"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.Delete(ctx, "ours", spec); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ours); err != nil {
		t.Fatalf("a file understudy did not write was deleted: %v", err)
	}
	// Where extended attributes are not kept, the state directory's record
	// stands for the marker.
	if _, err := f.Reconcile(ctx, "ours", spec); err != nil {
		t.Fatal(err)
	}
	readOwnerMarker = func(string) (string, error) { return "", syscall.ENOTSUP }
	defer func() { readOwnerMarker = getOwnerXattr }()
	if err := NewFile("n1", "").Delete(ctx, "ours", spec); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ours); err != nil {
		t.Fatalf("no marker, no record, deleted: %v", err)
	}
	if err := f.Delete(ctx, "ours", spec); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ours); !os.IsNotExist(err) {
		t.Errorf("written, recorded, not deleted: %v", err)
	}
}

// Finding: kill -9 during an apply left .understudy-* files for good.
// The next reconcile, delete or start of the resource removes them.
func TestFileRemovesTempFilesACrashLeft(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "motd")
	left := filepath.Join(dir, ".motd"+TempPrefix+"0123456789ab")
	other := filepath.Join(dir, ".other"+TempPrefix+"0123456789ab")
	for _, p := range []string{left, other} {
		if err := os.WriteFile(p, []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f := NewFile("n1", t.TempDir())
	if err := f.Recover(ctx, "motd", Spec{"path": path, "content": "hi\n"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("temp file left: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another file's temp file was removed: %v", err)
	}
}

// Finding: the root agent followed a symlinked parent directory owned by
// an unprivileged user. Components that neither root nor the agent own
// are refused; a trusted symbolic link is followed.
func TestFileRefusesUntrustedParents(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files away")
	}
	ctx := context.Background()
	dir := t.TempDir()
	target := filepath.Join(dir, "etc")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	userDir := filepath.Join(dir, "home")
	if err := os.Mkdir(userDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(userDir, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	rootLink := filepath.Join(dir, "rootlink")
	if err := os.Symlink(target, rootLink); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	f := NewFile("n1", t.TempDir())
	for _, tc := range []struct{ path, want string }{
		{filepath.Join(link, "passwd"), "is a symbolic link owned by uid 1000, neither root nor this agent (uid 0): refusing to follow it"},
		{filepath.Join(userDir, "x", "passwd"), "belongs to uid 1000, neither root nor this agent (uid 0): refusing to write through it"},
		{filepath.Join(open, "passwd"), "is writable by others (mode 0777, no sticky bit)"},
	} {
		_, err := f.Reconcile(ctx, "p", Spec{"path": tc.path, "content": "x"})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.path, err, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(target, "passwd")); !os.IsNotExist(err) {
		t.Errorf("written through an untrusted link: %v", err)
	}
	if o, err := f.Reconcile(ctx, "p", Spec{"path": filepath.Join(rootLink, "passwd"), "content": "x"}); err != nil || !o.InSync {
		t.Errorf("through a link of root's: %+v %v", o, err)
	}
	// A symbolic link at the path itself is not a regular file.
	if err := os.Symlink("/etc/hostname", filepath.Join(target, "hostname")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Reconcile(ctx, "h", Spec{"path": filepath.Join(target, "hostname"), "content": "x"}); err == nil || !strings.Contains(err.Error(), "is a symbolic link: the file kind manages regular files only") {
		t.Errorf("a symbolic link at the path: %v", err)
	}
}
